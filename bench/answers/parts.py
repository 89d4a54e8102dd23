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

from bench.helpers import REPO, Recorded, halves, machine_load, wilson, write_json

DEFAULT = REPO / "eval/two_part_questions.jsonl"
ARMS = ("llm", "llm_without_rule", "no_llm")


def normal(text: str) -> str:
    return " ".join(text.lower().replace("\\", "").split())


def judge(row: dict, text: str, held_back: bool) -> list[dict]:
    """Each part of `row` as the answer `text` treats it. A part is named as not stated by the line
    the parts rule writes for the question's own wording of it (`asks` splits the question as the
    rule does)."""
    from rag.answer.question import asks
    from rag.prompts import UNSTATED_PART

    said = normal(text)
    split = asks(row["question"])
    out = []
    for k, part in enumerate(row["parts"]):
        named = len(split) == len(row["parts"]) and UNSTATED_PART.format(part=split[k]) in text
        out.append(
            {
                "stated": part["stated"],
                "answered": any(normal(f) in said for f in part["key_facts"]),
                "flagged": named,
                "held_back": held_back,
            }
        )
    return out


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


def run(store: Path, rows: list[dict], replies: Path | None = None) -> list[dict]:
    """Each question answered by the three arms, judged part by part."""
    from rag import RAG
    from rag.evaluation.without import without

    rag = RAG(store_dir=store)
    if not rag.has_llm:
        raise SystemExit("set RAG_LLM=local (or an OpenAI-compatible endpoint) to compare")
    # The model's reply, once: the engine without the rule reads the same reply (bench.helpers).
    model = Recorded(rag.llm, replies)
    rag_off = RAG(without(rag.settings, ["parts"])[0], embedder=rag.embedder, llm=model)
    rag = RAG(rag.settings, embedder=rag.embedder, llm=model)
    print(f"machine: {machine_load()}")
    judged = []
    for row in rows:
        answers = {
            "llm": rag.ask(row["question"]),
            "llm_without_rule": rag_off.ask(row["question"]),
            "no_llm": rag.ask(row["question"], llm=False),
        }
        entry = {"id": row["id"], "heldout": bool(row.get("heldout"))}
        for arm, answer in answers.items():
            entry[arm + "_text"], entry[arm + "_held_back"] = answer.answer, answer.abstained
        judged.append(entry)
        print(row["id"], flush=True)
    return judged


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path)
    ap.add_argument("--questions", type=Path, default=DEFAULT)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--from-json", type=Path, help="judge a saved run again (no model)")
    ap.add_argument(
        "--replies", type=Path, help="keep the model's replies here, and reuse those kept"
    )
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    if args.from_json:
        judged = json.loads(args.from_json.read_text())["rows"]
    elif args.store:
        judged = run(args.store, rows, args.replies)
    else:
        ap.error("give --store DIR, or --from-json RUN")
    by_id = {row["id"]: row for row in rows}
    for entry in judged:
        for arm in ARMS:
            held = entry.get(arm + "_held_back", (entry.get(arm) or [{}])[0].get("held_back"))
            entry[arm] = judge(by_id[entry["id"]], entry[arm + "_text"], bool(held))
    result = {}
    for half, group in halves(judged):
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
