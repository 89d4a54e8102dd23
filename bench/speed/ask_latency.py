"""Time to first character and total time of `rag ask`, as a user sees them in a terminal.

    # a local OpenAI-compatible server, e.g. llama.cpp's with the bundled SmolLM2: python -m
llama_cpp.server --model $(python -c "from rag.modelfiles import bundled_gguf;
print(bundled_gguf())") \\ --host 127.0.0.1 --port 8080 --n_threads 1 --n_threads_batch 1
--model_alias smol & OPENAI_BASE_URL=http://127.0.0.1:8080/v1 RAG_LLM_MODEL=smol python -m
bench.speed.ask_latency --store DIR --runs 10

Each run is a fresh `rag ask` process (cold start included) on a different question of the set;
the first byte on stdout is the first character of the answer. `--no-llm` measures extractive mode.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.helpers import REPO, machine_load, percentile


def run_once(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(first character, whole answer) seconds of one process running `cmd`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    first = None
    while True:
        chunk = os.read(proc.stdout.fileno(), 1024)
        if not chunk:
            break
        if first is None and chunk.strip():
            first = time.perf_counter() - start
    proc.wait()
    total = time.perf_counter() - start
    return first if first is not None else total, total


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--questions", type=Path, default=REPO / "eval/seed_questions.jsonl")
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--no-llm", action="store_true")
    args = ap.parse_args()
    rag = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    answerable = [r for r in rows if r["gold"]][:: max(1, len(rows) // (args.runs * 2))][
        : args.runs
    ]
    firsts, totals = [], []
    for row in answerable:
        cmd = [rag, "ask", row["question"], "--store", str(args.store)] + (
            ["--no-llm"] if args.no_llm else []
        )
        first, total = run_once(cmd)
        firsts.append(first)
        totals.append(total)
    mode = (
        "extractive"
        if args.no_llm or not (os.environ.get("OPENAI_BASE_URL") or os.environ.get("RAG_LLM"))
        else "llm"
    )
    print(
        f"rag ask ({mode}), {len(firsts)} runs: first character p50 {percentile(firsts, 50):.2f} s "
        f"(min {min(firsts):.2f}, max {max(firsts):.2f}); total p50 {percentile(totals, 50):.2f} s "
        f"(min {min(totals):.2f}, max {max(totals):.2f}); {machine_load()}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
