"""What each cheap signal says about answerability: AUC of answerable against near-miss and
not-covered questions, for the signals the issue names, from a `python -m bench.answers.quality`
run.

    python -m bench.answers.signals RUN.json --store DIR [--heldout include|exclude|only]

Signals, each computed per question (the run's answers for the model's, retrieval again for the
rest):
- `check`: the model's P(yes) of the answerability check, when the run asked it
  (`RAG_LLM_CHECK=true`);
- `best_similarity`: the best dense cosine of the retrieved papers; `margin`: its lead over the next
  paper;
- `term_coverage`: the IDF-weighted share of the question's words that the best paper's abstract
  holds;
- `named_evidence`: whether the model named a sentence (it answered rather than "not stated");
- `library_margin`: the best cosine less the best of the library of papers outside the index
  (rag/answer/rules/background.py);
- of answered questions only, about what the answer quotes: `quote_similarity`, the best cosine of
  the question to a quoted sentence; `quote_coverage`, the IDF-weighted share of the question's
  words that the quoted sentences and the cited papers' titles hold; `synthesis_kept`, whether any
  of the model's own sentences survived the support check (else the answer is quotes only). AUC 0.5
  is a coin; 1.0 separates perfectly. A 95% interval from a seeded bootstrap over questions.
  `--sweep NAME` prints, for thresholds of one signal, the share of answered questions of each group
  that a gate holding back answers below it would hold back.
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
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("run", type=Path)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/user_questions.jsonl")
    ap.add_argument(
        "--questions-also",
        type=Path,
        nargs="*",
        default=[REPO / "eval/not_covered_questions.jsonl"],
    )
    ap.add_argument("--heldout", choices=("include", "exclude", "only"), default="include")
    ap.add_argument("--sweep", help="a signal to sweep thresholds of")
    args = ap.parse_args()

    from rag import RAG
    from rag.answer.rules.background import library_best
    from rag.text import keyword_terms

    heldout = {
        json.loads(line)["id"]: bool(json.loads(line).get("heldout"))
        for path in [args.questions, *args.questions_also]
        for line in path.read_text().splitlines()
        if line.strip()
    }
    rag = RAG(store_dir=args.store)
    n_papers = rag.store.paper_count()
    df: dict[str, int] = {}
    for _, abstract in rag.store.all_papers():
        for t in set(keyword_terms(abstract or "")):
            df[t] = df.get(t, 0) + 1
    rows = []
    for a in json.loads(args.run.read_text())["answers"]:
        sub = a.get("subkind")
        if args.heldout != "include" and heldout.get(a["id"]) != (args.heldout == "only"):
            continue
        hits = rag._retrieve(a["question"], 5)
        sims = sorted((h.similarity or 0.0 for h in hits), reverse=True) + [0.0, 0.0]
        words = list(dict.fromkeys(keyword_terms(a["question"])))
        weight = {t: math.log((n_papers + 1) / (df.get(t, 0) + 0.5)) for t in words}
        top = set(keyword_terms(hits[0].chunk.abstract)) if hits else set()
        signals = {
            "best_similarity": sims[0],
            "margin": sims[0] - sims[1],
            "term_coverage": sum(weight[t] for t in words if t in top)
            / max(sum(weight.values()), 1e-9),
            "named_evidence": float(a.get("outcome") == "answered"),
            "library_margin": sims[0] - library_best(rag.embedder.embed_query(a["question"])),
        }
        if a.get("answerable") is not None:
            signals["check"] = a["answerable"]
        if a.get("outcome") == "answered":
            signals.update(quote_signals(rag, a, words, weight))
        rows.append((bool(a["gold"]), sub, signals))
    names = sorted({k for _, _, s in rows for k in s})
    print(
        f"{sum(g for g, _, _ in rows)} answerable, {sum(not g for g, _, _ in rows)} near-miss +"
        " not-covered"
    )
    for name in names:
        pos = [s[name] for g, _, s in rows if g and name in s]
        for group in ("near-miss", "not-covered"):
            neg = [s[name] for g, sub, s in rows if not g and sub == group and name in s]
            value, ci = auc(pos, neg), interval(pos, neg)
            if value is not None and ci is not None:
                print(
                    f"{name:16s} answerable vs {group:11s}: AUC {value:.2f} [{ci[0]:.2f},"
                    f" {ci[1]:.2f}] (n={len(pos)}/{len(neg)})"
                )
    if args.sweep:
        sweep(rows, args.sweep)
    return 0


def quote_lines(answer: str) -> tuple[str, list[tuple[int, str]]]:
    """The synthesis and the quoted sentences `(n, text)` of an evidence answer's text."""
    import re

    synthesis, _, block = (
        answer.partition("\n\n- ") if not answer.startswith("- ") else ("", "", answer[2:])
    )
    quotes = []
    for line in ("- " + block).splitlines():
        m = re.match(r"^- (?:.*?: )?(.*)\s\[(\d+)\]\s*$", line)
        if m:
            quotes.append((int(m.group(2)), m.group(1)))
    return synthesis.strip(), quotes


def quote_signals(rag, a: dict, words: list[str], weight: dict[str, float]) -> dict[str, float]:
    import numpy as np

    from rag.text import keyword_terms

    synthesis, quotes = quote_lines(a["answer"])
    if not quotes:
        return {"synthesis_kept": float(bool(synthesis))}
    by_n = {c["n"]: c["paper_id"] for c in a["citations"]}
    titles = [p.title for p in rag.papers([by_n[n] for n, _ in quotes if n in by_n])]
    vectors = np.asarray(
        rag.embedder.embed([a["question"], *(q for _, q in quotes)], truncate=True)
    )
    held = set(keyword_terms(" ".join([*(q for _, q in quotes), *titles])))
    return {
        "quote_similarity": float((vectors[1:] @ vectors[0]).max()),
        "quote_coverage": sum(weight[t] for t in words if t in held)
        / max(sum(weight.values()), 1e-9),
        "synthesis_kept": float(bool(synthesis)),
    }


def sweep(rows: list, name: str) -> None:
    groups: dict[str, list[float]] = {}
    for gold, sub, s in rows:
        if name in s:
            groups.setdefault("answerable" if gold else sub, []).append(s[name])
    print(f"\nheld back below each threshold of {name} (answered questions only; n per group)")
    print("threshold  " + "  ".join(f"{g}({len(v)})" for g, v in sorted(groups.items())))
    for t in sorted({round(v, 2) for vs in groups.values() for v in vs}):
        print(
            f"{t:9.2f}  "
            + "  ".join(
                f"{sum(x < t for x in v) / len(v):.2f}".rjust(len(g) + 4)
                for g, v in sorted(groups.items())
            )
        )


if __name__ == "__main__":
    sys.exit(main())
