"""What the topic check (rag/answer/rules/topic.py) and the library rule
(rag/answer/rules/background.py) decide, per kind of question, without a model: they run on the
retrieved papers before the model is asked, so their decisions are exact for any run with the same
store.

    python -m bench.answers.topic_check --store DIR [--questions FILE ...] [--show
answerable,not-covered] [--rule topic|background|either]

For each kind (answerable, near-miss, not-covered, off-topic) and each part (the tuning part; the
held-out part: questions marked `heldout` and every question of the sets written blind to the rules,
the fresh_*, answer_type and paraphrase_icml files), the share of questions whose topic term or name
none of the retrieved papers holds: held back for near-miss and not-covered questions, lost for
answerable ones (95% Wilson intervals). `--show` lists the questions of those kinds the check holds
back, with their terms. `--rule background` asks the library rule instead (at
RAG_BACKGROUND_MARGIN), `--rule either` both, as answers do.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from bench.helpers import REPO, wilson

BLIND = ("fresh_", "answer_type", "paraphrase_icml")
SETS = [
    "user_questions.jsonl",
    "not_covered_questions.jsonl",
    "seed_questions.jsonl",
    "fresh_typed_questions.jsonl",
    "fresh_names_questions.jsonl",
    "answer_type_questions.jsonl",
]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument(
        "--questions", type=Path, nargs="+", default=[REPO / "eval" / name for name in SETS]
    )
    ap.add_argument(
        "--show", default="", help="kinds whose held-back questions to list, comma-separated"
    )
    ap.add_argument("--rule", choices=("topic", "background", "either"), default="topic")
    args = ap.parse_args()

    from rag import RAG
    from rag.answer.evidence import is_list_question
    from rag.answer.rules.background import uncovered
    from rag.answer.rules.topic import absent_from

    rag = RAG(store_dir=args.store)
    groups: dict[tuple[str, str], list[tuple[str, list[str], str]]] = defaultdict(list)
    for path in args.questions:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            q = json.loads(line)
            kind = "answerable" if q.get("gold") else (q.get("subkind") or q.get("kind"))
            part = "held out" if q.get("heldout") or path.name.startswith(BLIND) else "tuning"
            hits = rag._retrieve(q["question"], rag.settings.top_k)
            absent = absent_from(q["question"], hits) if args.rule != "background" else []
            if args.rule != "topic" and uncovered(
                rag.embedder.model_id,
                rag.embedder.embed_query(q["question"]),
                hits,
                is_list_question(q["question"]),
                rag.settings.background_margin,
            ):
                absent.append("(the library)")
            groups[(kind, part)].append((q["id"], absent, q["question"]))
    print(
        f"{args.store}: {rag.store.paper_count()} papers; the share of questions held back by rule"
        f" {args.rule}"
    )
    for (kind, part), rows in sorted(groups.items()):
        held = sum(bool(a) for _, a, _ in rows)
        low, high = wilson(held, len(rows))
        print(
            f"{kind:11s} {part:8s} {held:3d} of {len(rows):3d}  {held / len(rows):.2f} [{low:.2f},"
            f" {high:.2f}]"
        )
    show = {k for k in args.show.split(",") if k}
    for (kind, part), rows in sorted(groups.items()):
        if kind in show:
            for qid, absent, question in rows:
                if absent:
                    print(f"  {kind} {part} {qid}: {', '.join(absent)} | {question[:100]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
