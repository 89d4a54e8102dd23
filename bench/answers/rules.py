"""The answer-type rules (rag/answer/rules/answer_type.py) applied to the replies of one run made
without them.

    RAG_LLM=local RAG_ANSWER_TYPE_CHECK=false python -m bench.answers.quality --store DIR \
        --questions Q.jsonl --json off.json
    git show REV:rag/answer/rules/answer_type.py > before.py  # the rules as they were
    python -m bench.answers.rules off.json --store DIR [--before before.py] [--topic]

The local model's replies are the same with and without the rules (they only read the finished
reply), so one run serves every version of them: each answered typed question is held back or not by
the rules of each version, with the same five abstracts (retrieval is deterministic). Prints, per
version, the near misses held back and the answerable questions answered, and each question whose
outcome the versions disagree on. `--topic` adds today's rules with the topic check
(rag/answer/rules/topic.py) before them: it decides on the retrieved papers before the model is
asked, so what it holds back is exact for the same store.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

from bench.helpers import wilson

_BULLET = re.compile(r"^\s*[-*]\s+")


def load_rules(path: Path) -> ModuleType:
    """An earlier copy of rag/answer/rules/answer_type.py, as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"rules_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(
            f"answer_rules: cannot load {path}: give a copy of rag/answer/rules/answer_type.py"
        )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def holds(
    rules: ModuleType,
    question: str,
    text: str,
    pieces: list[tuple[int, str]],
    keyword_scores: dict[int, float],
    abstracts: list[str],
) -> str | None:
    """What these rules make of an answered reply: "answer_type", "answer_source" or None
    (answered). Earlier versions took no abstracts."""
    takes_sources = "sources" in rules.gives_asked_type.__code__.co_varnames
    extra = (abstracts,) if takes_sources else ()
    if not rules.gives_asked_type(question, text, *extra):
        return "answer_type"
    if rules.from_another_paper(question, pieces, keyword_scores, *extra):
        return "answer_source"
    return None


def pieces_of(
    answer: str, citations: list[dict], positions: dict[str, int]
) -> list[tuple[int, str]]:
    """The answer's sentences with the source each cites, in the retrieval order's numbering (the
    answer's own numbering is renumbered by what it cites)."""
    from rag.answer.citations import parse_markers, split_sentences

    paper_of = {c["n"]: c["paper_id"] for c in citations}
    return [
        (positions.get(paper_of.get(n, ""), 0), _BULLET.sub("", sentence))
        for line in answer.splitlines()
        for sentence in split_sentences(line)
        for n in set(parse_markers(sentence))
    ]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "run",
        type=Path,
        help="bench.answers.quality --json of a run with RAG_ANSWER_TYPE_CHECK=false",
    )
    ap.add_argument("--store", type=Path, required=True, help="the store the run asked")
    ap.add_argument(
        "--before", type=Path, help="an earlier rag/answer/rules/answer_type.py to compare with"
    )
    ap.add_argument("--topic", action="store_true", help="also today's rules after the topic check")
    args = ap.parse_args()

    import rag.answer.rules.answer_type as now
    from rag import RAG
    from rag.answer.rules.topic import absent_from

    versions = {
        "now": now,
        **({"before": load_rules(args.before)} if args.before else {}),
        **({"topic": now} if args.topic else {}),
    }
    rag = RAG(store_dir=args.store, llm="none")
    run = json.loads(args.run.read_text())
    if any(r.get("abstained_by") in ("answer_type", "answer_source") for r in run["answers"]):
        raise SystemExit(
            "answer_rules: this run had the rules on; rerun it with RAG_ANSWER_TYPE_CHECK=false"
        )
    counts: dict[tuple[str, str], list[int]] = {}
    for record in run["answers"]:
        group = (
            "near misses held back"
            if record.get("subkind") == "near-miss"
            else "answerable answered"
        )
        if record.get("subkind") in ("not-covered", "off-topic"):
            continue
        outcomes = {}
        hits = rag._retrieve(record["question"], 5)
        absent = absent_from(record["question"], hits)
        for name, rules in versions.items():
            outcome = record["outcome"]
            if name == "topic" and absent:
                outcome = "not_stated"  # or not_covered: held back either way
            elif outcome == "answered" and rules.asked_type(record["question"]) is not None:
                positions = {h.paper.paper_id: n for n, h in enumerate(hits, 1)}
                held = holds(
                    rules,
                    record["question"],
                    record["answer"],
                    pieces_of(record["answer"], record["citations"], positions),
                    {n: h.keyword for n, h in enumerate(hits, 1)},
                    [h.chunk.abstract for h in hits],
                )
                outcome = "not_stated" if held else outcome
            outcomes[name] = outcome
            good = (outcome != "answered") if group.startswith("near") else (outcome == "answered")
            counts.setdefault((name, group), []).append(int(good))
        if len(set(outcomes.values())) > 1:
            print(f"{record['id']}: {outcomes} | {record['question'][:90]}")
    for (name, group), marks in sorted(counts.items()):
        low, high = wilson(sum(marks), len(marks))
        print(
            f"{name:7s} {group}: {sum(marks)}/{len(marks)} = {sum(marks) / len(marks):.2f}"
            f" [{low:.2f}, {high:.2f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
