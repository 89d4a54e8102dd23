"""Questions that describe one paper in other words: is the paper the answer cites the right one?

    RAG_LLM=local python -m bench.answers.which_paper --store DIR [--questions FILE] [--replies R]
[--json OUT] [--no-llm]

Every question of the set (default eval/paraphrase_icml.jsonl: 80 descriptions of one ICML 2026
paper each, half held out) is asked once; an answer is `right` when it cites the gold paper, `wrong`
when it is answered citing only other papers (a confident wrong answer), `held` when it is held back
(not stated, not covered). Prints, per half, the wrong share of answered questions (the issue's
target: <= 0.05), how many held answers had the gold paper among the papers found, key facts
reaching the answer, and how often retrieval ranked the gold paper first (ranks in the output are
retrieval's; `cited`: the retrieval ranks of the papers cited). `--replies` keeps the model's
replies, so a rule can be judged again on the same replies without the model. The store: the seeds
plus the ICML 2026 main track
(`rag ingest corpus ../shared/data/icml2026_main.jsonl.gz --store DIR`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO, Recorded, halves, machine_load, wilson, write_json


def verdict(answer, gold: set[str]) -> str:
    cited = {s.paper_id for s in answer.sources if s.cited}
    if answer.outcome != "answered":
        return "held"
    return "right" if cited & gold else "wrong"


def found_at(source) -> int:
    """A source's rank in retrieval (its number `n` is the answer's: cited papers first)."""
    return source.retrieval.rank if source.retrieval is not None else source.n


def figures(rows: list[dict]) -> dict:
    answered = [r for r in rows if r["verdict"] != "held"]
    wrong = sum(r["verdict"] == "wrong" for r in answered)
    held = [r for r in rows if r["verdict"] == "held"]
    facts = [r["facts"] for r in rows]
    return {
        "questions": len(rows),
        "right": sum(r["verdict"] == "right" for r in rows),
        "wrong": wrong,
        "held": len(held),
        "wrong_of_answered": wrong / max(len(answered), 1),
        "wrong_of_answered_95": [round(x, 2) for x in wilson(wrong, len(answered))],
        "held_with_gold_found": sum(r["gold_rank"] is not None for r in held),
        "gold_first": sum(r["gold_rank"] == 1 for r in rows),
        "key_facts": sum(facts) / max(len(facts), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/paraphrase_icml.jsonl")
    ap.add_argument("--replies", type=Path, help="keep the model's replies here, reuse those kept")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-llm", action="store_true", help="extractive answers")
    args = ap.parse_args()
    from rag import RAG
    from rag.evaluation.metrics import key_fact_recall

    rag = RAG(store_dir=args.store)
    if rag.has_llm and not args.no_llm:
        rag = RAG(rag.settings, embedder=rag.embedder, llm=Recorded(rag.llm, args.replies))
    print(f"machine: {machine_load()}")
    rows = []
    for line in args.questions.read_text().splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        gold = set(q["gold"])
        answer = rag.ask(q["question"], llm=not args.no_llm)
        ranks = [found_at(s) for s in answer.sources if s.paper_id in gold]
        row = {
            "id": q["id"],
            "heldout": bool(q.get("heldout")),
            "verdict": verdict(answer, gold),
            "outcome": answer.outcome,
            "gold_rank": min(ranks) if ranks else None,
            "cited": sorted(found_at(s) for s in answer.sources if s.cited),
            "facts": key_fact_recall(answer.answer, q.get("key_facts", [])),
            "answer": answer.answer,
            "papers": {s.n: [s.paper_id, s.title] for s in answer.sources if s.cited},
        }
        rows.append(row)
        print(q["id"], row["verdict"], row["outcome"], "gold", row["gold_rank"], row["cited"])
    result = {half: figures(group) for half, group in halves(rows)}
    for half, f in result.items():
        print(
            f"{half} ({f['questions']}): right {f['right']}, wrong {f['wrong']}, held {f['held']}"
            f" ({f['held_with_gold_found']} with the gold paper found); wrong of answered"
            f" {f['wrong_of_answered']:.2f} {f['wrong_of_answered_95']}; gold first"
            f" {f['gold_first']}; key facts {f['key_facts']:.2f}"
        )
    if args.json:
        write_json(args.json, {"machine": machine_load(), "figures": result, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
