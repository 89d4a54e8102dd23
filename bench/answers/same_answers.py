"""Answers of one commit, to compare with another's: a refactor must leave them byte-identical.

    git worktree add /tmp/before REV
    PYTHONPATH=/tmp/before python -m bench.answers.same_answers --store DIR --style evidence \
        --out before.jsonl
    python -m bench.answers.same_answers --store DIR --style evidence --out after.jsonl
    cmp before.jsonl after.jsonl

With `--replies FILE` the model's replies are kept in FILE and read from it first (bench.helpers):
the second run reads the first one's replies to the same prompts, in seconds.

Asks 28 questions (the first five of every kind of eval/user_questions.jsonl, 24 in all, and four of
eval/not_covered_questions.jsonl) in one style (extractive, or the configured LLM evidence-first or
free-form) and writes each answer's JSON, with the fields that hold no behaviour (`usage`: tokens
and time) left out and the diagnostics kept (`abstained_by`, `withdrawn`), one line a question.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO, Recorded

TIMING = {"usage"}


def questions() -> list[str]:
    rows = [
        json.loads(line)
        for line in (REPO / "eval/user_questions.jsonl").read_text().split("\n")
        if line
    ]
    per_kind: dict[str, int] = {}
    picked = []
    for row in rows:
        if per_kind.get(row["kind"], 0) < 5:
            picked.append(row["question"])
            per_kind[row["kind"]] = per_kind.get(row["kind"], 0) + 1
    covered = (REPO / "eval/not_covered_questions.jsonl").read_text().split("\n")
    return picked[:24] + [json.loads(line)["question"] for line in covered if line][:4]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--style", choices=["extractive", "evidence", "free"], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--replies", type=Path, help="keep the model's replies here, reuse those kept")
    args = ap.parse_args()
    import rag
    from rag import RAG

    print(f"rag from {rag.__file__}", file=sys.stderr)
    kw = {"llm": "none"} if args.style == "extractive" else {"answer_style": args.style}
    engine = RAG(store_dir=args.store, **kw)
    if args.replies and engine.has_llm:
        engine = RAG(
            engine.settings, embedder=engine.embedder, llm=Recorded(engine.llm, args.replies)
        )
    with args.out.open("w") as out:
        for question in questions():
            answer = engine.ask(question)
            data = {
                k: v for k, v in json.loads(answer.model_dump_json()).items() if k not in TIMING
            }
            data["_abstained_by"], data["_withdrawn"] = answer.abstained_by, answer.withdrawn
            out.write(json.dumps(data, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
