"""Follow-up questions: how well each way of making them standalone finds the paper they are about.

A conversation starts with a seed question about one paper (its first turn and the extractive answer
to it); the next message is either a follow-up that leans on it ("What are its main limitations?",
gold: the same paper) or a new standalone question about another paper (gold: that paper, and the
rewrite must not drag the first topic in). Each message is turned into the query retrieved with:

  none        the message alone
  heuristic   the rule used without an LLM (a short, pronoun-led message gets the topic prepended)
  llm         the model's rewrite (`REWRITE_PROMPT`, what `RAG.chat` does with an LLM configured)

and the figures are hit@1 and hit@5 of the gold paper for the query, with 95% intervals, plus the
model's rewrite time. The LLM comes from the settings (OPENAI_BASE_URL=... or RAG_LLM=local).

    RAG_LLM=local python -m bench.answers.followups --store DIR [--pairs 12] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from bench.answers.quality import DEFAULT_QUESTIONS, fmt, ratio
from bench.helpers import percentile, write_json

FOLLOW_UPS = (
    "What are its main limitations?",
    "How was it evaluated?",
    "what results do they report",
)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS[0])
    ap.add_argument(
        "--pairs", type=int, default=12, help="conversations (each: 3 follow-ups and 1 switch)"
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rag import RAG
    from rag.answer.question import rewrite

    rag = RAG(store_dir=args.store)
    if not rag.has_llm:
        sys.exit(
            "configure an LLM (OPENAI_BASE_URL=... or RAG_LLM=local): the llm rewrite is what is"
            " measured"
        )
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["kind"] in ("keyword", "paraphrase") and len(r["gold"]) == 1]
    random.Random(args.seed).shuffle(rows)
    firsts, switches = rows[: args.pairs], rows[args.pairs : 2 * args.pairs]
    cases = []
    for first, other in zip(firsts, switches):
        history = [
            {"role": "user", "content": first["question"]},
            {"role": "assistant", "content": rag.ask(first["question"], llm=False).answer},
        ]
        cases += [
            {"kind": "follow-up", "history": history, "message": m, "gold": first["gold"][0]}
            for m in FOLLOW_UPS
        ]
        cases.append(
            {
                "kind": "switch",
                "history": history,
                "message": other["question"],
                "gold": other["gold"][0],
            }
        )

    llm = rag.llm
    results = []
    for case in cases:
        queries = {
            "none": case["message"],
            "heuristic": rewrite(case["message"], case["history"], None),
        }
        start = time.perf_counter()
        queries["llm"] = rewrite(case["message"], case["history"], lambda: llm)
        seconds = time.perf_counter() - start
        ranks = {}
        for method, query in queries.items():
            ids = [s.paper_id for s in rag.search(query, k=5)]
            ranks[method] = ids.index(case["gold"]) + 1 if case["gold"] in ids else None
        results.append(
            {
                **{k: case[k] for k in ("kind", "message", "gold")},
                "queries": queries,
                "ranks": ranks,
                "llm_seconds": seconds,
            }
        )
        sys.stderr.write(".")
        sys.stderr.flush()
    sys.stderr.write("\n")

    figures: dict = {}
    print(f"{len(cases)} messages ({args.pairs} conversations); LLM {llm.label}")
    print("| messages | method | hit@1 | hit@5 |")
    print("|---|---|---|---|")
    for kind in ("follow-up", "switch"):
        group = [r for r in results if r["kind"] == kind]
        for method in ("none", "heuristic", "llm"):
            hit1 = ratio([r["ranks"][method] == 1 for r in group], [1] * len(group))
            hit5 = ratio([r["ranks"][method] is not None for r in group], [1] * len(group))
            figures[f"{kind}/{method}"] = {"hit@1": hit1, "hit@5": hit5}
            print(f"| {kind} | {method} | {fmt(hit1)} | {fmt(hit5)} |")
    secs = [r["llm_seconds"] for r in results]
    figures["llm_rewrite_s_p50"] = percentile(secs, 50)
    print(f"LLM rewrite: p50 {figures['llm_rewrite_s_p50']:.1f} s, max {max(secs):.1f} s")
    for r in results[:8]:
        print(f"  [{r['kind']}] {r['message']!r} -> {r['queries']['llm']!r}")
    if args.json:
        write_json(args.json, {"llm": llm.label, "figures": figures, "results": results}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
