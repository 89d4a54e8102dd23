#!/usr/bin/env python3
"""A warm process asked questions it has not seen: what a search costs, and what reading its hits as
an answer does costs on top (`RAG._scored`: all-MiniLM-L6-v2 embeds the hits' chunks when the index
is another model's).

  python -m bench.speed.new_questions --store DIR [--questions FILE ...]

Each question is asked once (the ICML paraphrase sets by default, 269), after a warm-up question:
`RAG.search`'s work (the index model's cosines), then the reading an answer adds, then the rest of
`RAG.ask(llm=False)` (its question and chunk vectors remembered by then: the sentences' work).
Prints p50/p95 (nearest rank) in ms, and the machine's load before and after.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.helpers import REPO, machine_load, percentile
from rag import RAG

SETS = ["paraphrase_icml.jsonl", "paraphrase_icml_blind.jsonl", "paraphrase_icml_hard.jsonl"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--questions", type=Path, nargs="*", default=[REPO / "eval" / s for s in SETS])
    args = p.parse_args(argv)
    questions = list(
        dict.fromkeys(
            json.loads(line)["question"]
            for path in args.questions
            for line in path.read_text().splitlines()
            if line.strip()
        )
    )
    rag = RAG(store_dir=args.store, llm="none")
    rag.ask("What is this collection about?", llm=False)  # loads both models, Chroma, keywords
    print(
        f"{len(questions)} questions, store {args.store} ({rag.settings.embed_model}); "
        f"{machine_load()}"
    )
    times: dict[str, list[float]] = {
        "search": [],
        "reading for an answer": [],
        "rest of ask --no-llm": [],
    }
    for question in questions:
        start = time.perf_counter()
        hits = rag._retrieve(question, scored=False)
        searched = time.perf_counter()
        rag._scored(hits, question)
        read = time.perf_counter()
        rag.ask(question, llm=False)  # its query and chunk vectors now remembered: the rest
        done = time.perf_counter()
        times["search"].append((searched - start) * 1000)
        times["reading for an answer"].append((read - searched) * 1000)
        times["rest of ask --no-llm"].append((done - read) * 1000)
    for name, values in times.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        print(f"{name:>24}: p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")
    print(machine_load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
