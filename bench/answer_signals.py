"""What each cheap signal says about answerability: AUC of answerable against near-miss and not-covered
questions, for the signals the issue names, from a `python -m bench.answers` run.

    python -m bench.answer_signals RUN.json --store DIR [--heldout include|exclude|only]

Signals, each computed per question (the run's answers for the model's, retrieval again for the rest):
- `check`: the model's P(yes) of the answerability check, when the run asked it (`RAG_LLM_CHECK=true`);
- `best_similarity`: the best dense cosine of the retrieved papers; `margin`: its lead over the next paper;
- `term_coverage`: the IDF-weighted share of the question's words that the best paper's abstract holds;
- `named_evidence`: whether the model named a sentence (it answered rather than "not stated").
AUC 0.5 is a coin; 1.0 separates perfectly. A 95% interval from a seeded bootstrap over questions.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from bench.helpers import REPO


def auc(pos: list[float], neg: list[float]) -> float | None:
    if not pos or not neg:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def interval(pos: list[float], neg: list[float], samples: int = 2000) -> tuple[float, float] | None:
    rng = random.Random(7)
    values = []
    for _ in range(samples):
        a = auc([rng.choice(pos) for _ in pos], [rng.choice(neg) for _ in neg])
        if a is not None:
            values.append(a)
    if not values:
        return None
    values.sort()
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/user_questions.jsonl")
    ap.add_argument("--heldout", choices=("include", "exclude", "only"), default="include")
    args = ap.parse_args()

    from rag import RAG
    from rag.text import keyword_terms

    heldout = {json.loads(line)["id"]: bool(json.loads(line).get("heldout"))
               for line in args.questions.read_text().splitlines() if line.strip()}
    rag = RAG(store_dir=args.store)
    n_papers = rag.store.paper_count()
    df: dict[str, int] = {}
    for _, abstract in rag.store.all_papers():
        for t in set(keyword_terms(abstract or "")):
            df[t] = df.get(t, 0) + 1
    rows = []
    for a in json.loads(args.run.read_text())["answers"]:
        sub = a.get("subkind")
        if sub == "off-topic" or (args.heldout != "include" and heldout.get(a["id"]) != (args.heldout == "only")):
            continue
        hits = rag._retrieve(a["question"], 5)
        sims = sorted((h.similarity or 0.0 for h in hits), reverse=True) + [0.0, 0.0]
        words = list(dict.fromkeys(keyword_terms(a["question"])))
        weight = {t: math.log((n_papers + 1) / (df.get(t, 0) + 0.5)) for t in words}
        top = set(keyword_terms(hits[0].chunk.abstract)) if hits else set()
        signals = {"best_similarity": sims[0], "margin": sims[0] - sims[1],
                   "term_coverage": sum(weight[t] for t in words if t in top) / max(sum(weight.values()), 1e-9),
                   "named_evidence": float(a.get("outcome") == "answered")}
        if a.get("answerable") is not None:
            signals["check"] = a["answerable"]
        rows.append((bool(a["gold"]), sub, signals))
    names = sorted({k for _, _, s in rows for k in s})
    print(f"{sum(g for g, _, _ in rows)} answerable, {sum(not g for g, _, _ in rows)} near-miss + not-covered")
    for name in names:
        pos = [s[name] for g, _, s in rows if g and name in s]
        for group in ("near-miss", "not-covered"):
            neg = [s[name] for g, sub, s in rows if not g and sub == group and name in s]
            value, ci = auc(pos, neg), interval(pos, neg)
            if value is not None and ci is not None:
                print(f"{name:16s} answerable vs {group:11s}: AUC {value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}] "
                      f"(n={len(pos)}/{len(neg)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
