""" "Which papers" lists against gold lists: the model's list with the list rule, the same list
without it (the baseline, in the same run), and the no-LLM list.

    RAG_LLM=local python -m bench.answers.lists --store DIR [--questions FILE ...] [--json OUT]

For each list question (`kind: multi`, gold: every paper that fits), the papers an answer cites
against the gold: precision (cited gold / cited, over all questions' citations) and recall (cited
gold / gold), each with a 95% bootstrap interval over questions, per half (`heldout` false: the
questions the rule may be tuned on; true: held out) and overall; and how many listed papers fall
outside the extractive answer's fit test (the list rule's promise: none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO, Recorded, halves, machine_load, write_json

DEFAULT = [REPO / "eval/list_questions.jsonl"]
ARMS = ("llm", "llm_without_rule", "no_llm")


def cited(answer) -> set[str]:
    return {s.paper_id for s in answer.sources if s.cited}


def ask(rag, rag_off, question: str, arm: str):
    """The answer of one arm: the engine as configured, the engine without the list rule (the same
    embedder and model), or the no-LLM answer."""
    if arm == "no_llm":
        return rag.ask(question, llm=False)
    return (rag_off if arm == "llm_without_rule" else rag).ask(question)


def figures(rows: list[dict], arm: str) -> dict:
    from rag.evaluation import interval95

    hit = [len(r[arm] & r["gold"]) for r in rows]
    n_cited = [len(r[arm]) for r in rows]
    n_gold = [len(r["gold"]) for r in rows]
    return {
        "precision": sum(hit) / max(sum(n_cited), 1),
        "precision_95": interval95(hit, n_cited),
        "recall": sum(hit) / max(sum(n_gold), 1),
        "recall_95": interval95(hit, n_gold),
        "unfit_listed": sum(len(r[arm] - r["fit"]) for r in rows),
        "questions": len(rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, nargs="+", default=DEFAULT)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--replies", type=Path, help="keep the model's replies here, and reuse those kept"
    )
    args = ap.parse_args()
    from rag import RAG
    from rag.answer.rules.list_fit import fitting
    from rag.evaluation.without import without

    rag = RAG(store_dir=args.store)
    if not rag.has_llm:
        print("set RAG_LLM=local (or an OpenAI-compatible endpoint) to compare the lists")
        return 1
    # The model's reply, once: the engine without the rule reads the same reply (bench.helpers).
    model = Recorded(rag.llm, args.replies)
    rag_off = RAG(without(rag.settings, ["list_fit"])[0], embedder=rag.embedder, llm=model)
    rag = RAG(rag.settings, embedder=rag.embedder, llm=model)
    print(f"machine: {machine_load()}")
    rows = []
    questions = [
        json.loads(line)
        for path in args.questions
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    for q in questions:
        hits = rag._retrieve(q["question"])
        fit = {
            hits[n - 1].paper.paper_id
            for n in fitting(rag.embedder, q["question"], q["question"], hits)
        }
        row = {"id": q["id"], "heldout": bool(q.get("heldout")), "gold": set(q["gold"]), "fit": fit}
        for arm in ARMS:
            row[arm] = cited(ask(rag, rag_off, q["question"], arm))
        rows.append(row)
        print(q["id"], {arm: len(row[arm] & row["gold"]) / max(len(row[arm]), 1) for arm in ARMS})
    result = {}
    for half, group in halves(rows):
        result[half] = {arm: figures(group, arm) for arm in ARMS}
        print(f"{half} ({len(group)} questions):")
        for arm in ARMS:
            f = result[half][arm]
            print(
                f"  {arm:18s} precision {f['precision']:.2f} {f['precision_95']}"
                f"  recall {f['recall']:.2f} {f['recall_95']}  unfit listed {f['unfit_listed']}"
            )
    if args.json:
        write_json(
            args.json,
            {
                "figures": result,
                "rows": [
                    {k: sorted(v) if isinstance(v, set) else v for k, v in r.items()} for r in rows
                ],
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
