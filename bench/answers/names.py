"""What the cited-names rule (rag/answer/rules/answer_type.py's `unwritten_names`) makes of a run's
answered replies.

    python -m bench.answers.names RUN.json [RUN.json ...] --store DIR

The rule reads only the finished reply, the question and the abstracts of the papers the reply
cites, and comes after every other rule, so applying it to the answers a run gave without it is what
a run with it would give (the local model's replies are deterministic). For each run prints, per
kind of question, how many were answered and how many of those the rule would make `not_stated`, and
lists them with the names none of their cited papers writes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", type=Path, nargs="+", help="bench.answers.quality --json outputs")
    ap.add_argument("--store", type=Path, required=True, help="the store the runs asked")
    args = ap.parse_args()

    from rag import RAG
    from rag.answer.evidence import is_list_question
    from rag.answer.rules.answer_type import unwritten_names

    rag = RAG(store_dir=args.store, llm="none")
    for run in args.runs:
        counts: dict[str, list[int]] = {}
        for a in json.loads(run.read_text())["answers"]:
            group = "answerable" if a["gold"] else a.get("subkind") or "unanswerable"
            count = counts.setdefault(group, [0, 0, 0])
            count[0] += 1
            if a.get("outcome", "not_covered" if a["abstained"] else "answered") != "answered":
                continue
            count[1] += 1
            if is_list_question(a["question"]):
                continue  # each paper of a list stands on its own line: the rule is not asked
            # The abstract each paper was retrieved with (a paper may have several versions), as the
            # answer read it.
            hits = {h.paper.paper_id: h for h in rag._retrieve(a["question"], rag.settings.top_k)}
            names = unwritten_names(
                a["question"], [hits[p].title_and_abstract for p in a["cited"] if p in hits]
            )
            if names:
                count[2] += 1
                print(f"  {a['id']} {group}: {', '.join(names)} | {a['question'][:100]}")
        print(
            f"{run.name}: "
            + "; ".join(
                f"{g} {c[1]} of {c[0]} answered, {c[2]} of them held back by the rule"
                for g, c in counts.items()
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
