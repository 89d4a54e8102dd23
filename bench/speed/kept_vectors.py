"""`rag ask` with the answer vectors kept on disk (RAG_ANSWER_VECTOR_CACHE) or not.

    python -m bench.speed.kept_vectors --store DIR [--n 10] [--llm]

For each of N answerable questions of the seed set, three fresh `rag ask` processes in turn: the
first with the kept vectors in an empty directory (RAG_MODEL_CACHE_DIR; every paper's texts are
embedded and written), then without them, then with them again (read, not embedded). Prints the
median and worst time to the first character and to the end of each, and the ratio of the third
to the second. `--llm`: RAG_LLM=local, with the model's own cache directory (its first pass then
starts from the vectors earlier runs kept there, so only "without" and "again" are compared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.helpers import REPO, machine_load
from bench.speed.ask_latency import run_once


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--llm", action="store_true", help="RAG_LLM=local instead of --no-llm")
    args = ap.parse_args()
    rag = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    rows = [json.loads(line) for line in (REPO / "eval/seed_questions.jsonl").open()]
    questions = [r["question"] for r in rows if r["gold"]][::7][: args.n]
    cache = Path(tempfile.mkdtemp(prefix="kept-vectors-"))
    env = {**os.environ}
    if args.llm:
        env["RAG_LLM"] = "local"
    else:
        env["RAG_MODEL_CACHE_DIR"] = str(cache)
    passes = {"first": "true", "without": "false", "again": "true"}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in passes}
    print(machine_load())
    try:
        for question in questions:
            cmd = [rag, "ask", question, "--store", str(args.store)]
            cmd += [] if args.llm else ["--no-llm"]
            for name, kept in passes.items():
                times[name].append(run_once(cmd, {**env, "RAG_ANSWER_VECTOR_CACHE": kept}))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    for name, pairs in times.items():
        first, total = [p[0] for p in pairs], [p[1] for p in pairs]
        print(
            f"{name:8} first character p50 {statistics.median(first):.2f} s (max {max(first):.2f})"
            f"; whole answer p50 {statistics.median(total):.2f} s (max {max(total):.2f})"
        )
    ratio = [a[1] / w[1] for a, w in zip(times["again"], times["without"])]
    print(f"again / without, whole answer: p50 {statistics.median(ratio):.2f}; {machine_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
