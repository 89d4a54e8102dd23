"""Questions that ask two things: is each part answered, or named as not stated? With the parts
rule, without it (the baseline, in the same run), and without an LLM.

    RAG_LLM=local python -m bench.answers.parts --store DIR [--questions FILE] [--json OUT]

Each question of eval/two_part_questions.jsonl has two parts, each stated by the gold abstract
(with key facts) or not (a near miss). Per part: a stated part is answered when one of its key
facts is in the answer's text; a part the abstract does not state is handled when the answer names
it as not stated, or the whole answer is held back (`not_stated`, `not_covered`); a stated part
named as not stated is a false alarm. Shares with 95% Wilson intervals, per half (`heldout` false:
the rule may be tuned on them; true: held out).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.helpers import REPO, machine_load, wilson, write_json

DEFAULT = REPO / "eval/two_part_questions.jsonl"
ARMS = ("llm", "llm_without_rule", "no_llm")


def normal(text: str) -> str:
    return " ".join(text.lower().replace("\\", "").split())


def judge(row: dict, answer) -> list[dict]:
    """Each part of `row` as `answer` treats it."""
    from rag.prompts import UNSTATED_PART

    text = normal(answer.answer)
    lead = normal(UNSTATED_PART.format(part=""))
    named = [line for line in answer.answer.splitlines() if normal(line).startswith(lead)]
    out = []
    for k, part in enumerate(row["parts"]):
        answered = any(normal(f) in text for f in part["key_facts"])
        # The answer names a part as not stated by quoting the question's own words for it.
        flagged = bool(named) and _names_part(named, row, k)
        out.append(
            {
                "stated": part["stated"],
                "answered": answered,
                "flagged": flagged,
                "held_back": answer.abstained,
            }
        )
    return out


def _names_part(named: list[str], row: dict, k: int) -> bool:
    """Whether a "not stated" line names part `k` (1st or 2nd ask of the question) rather than the
    other: by the words it shares with each part's standalone wording."""
    words = [set(normal(p["ask"]).split()) for p in row["parts"]]
    for line in named:
        said = set(normal(line).split())
        overlap = [len(said & w) for w in words]
        if overlap[k] >= max(overlap):
            return True
    return False


def shares(parts: list[dict]) -> dict:
    stated = [p for p in parts if p["stated"]]
    unstated = [p for p in parts if not p["stated"]]

    def share(hits: int, n: int) -> dict:
        return {"share": round(hits / n, 3) if n else None, "n": n, "ci95": wilson(hits, n)}

    return {
        "stated_answered": share(sum(p["answered"] for p in stated), len(stated)),
        "unstated_handled": share(
            sum(p["flagged"] or p["held_back"] for p in unstated), len(unstated)
        ),
        "false_alarm": share(sum(p["flagged"] for p in stated), len(stated)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=DEFAULT)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from rag import RAG
    from rag.evaluation.without import without

    rag = RAG(store_dir=args.store)
    if not rag.has_llm:
        print("set RAG_LLM=local (or an OpenAI-compatible endpoint) to compare")
        return 1
    rag_off = RAG(without(rag.settings, ["parts"])[0], embedder=rag.embedder, llm=rag.llm)
    print(f"machine: {machine_load()}")
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    judged = []
    for row in rows:
        answers = {
            "llm": rag.ask(row["question"]),
            "llm_without_rule": rag_off.ask(row["question"]),
            "no_llm": rag.ask(row["question"], llm=False),
        }
        entry = {"id": row["id"], "heldout": bool(row.get("heldout"))}
        for arm, answer in answers.items():
            entry[arm] = judge(row, answer)
            entry[arm + "_text"] = answer.answer
        judged.append(entry)
        print(row["id"], {arm: [(p["answered"], p["flagged"]) for p in entry[arm]] for arm in ARMS})
    result = {}
    for half, group in (
        ("tuned", [j for j in judged if not j["heldout"]]),
        ("held out", [j for j in judged if j["heldout"]]),
        ("all", judged),
    ):
        result[half] = {arm: shares([p for j in group for p in j[arm]]) for arm in ARMS}
        print(f"{half} ({len(group)} questions):")
        for arm in ARMS:
            f = result[half][arm]
            print(
                f"  {arm:18s} stated parts answered {f['stated_answered']['share']}"
                f" {f['stated_answered']['ci95']}  unstated handled"
                f" {f['unstated_handled']['share']} {f['unstated_handled']['ci95']}"
                f"  false alarms {f['false_alarm']['share']}"
            )
    if args.json:
        write_json(args.json, {"figures": result, "rows": judged})
    return 0


if __name__ == "__main__":
    sys.exit(main())
