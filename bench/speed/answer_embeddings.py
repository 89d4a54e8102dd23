"""One answer's embedding work, with ONNX Runtime's threads spinning between operators or sleeping.

    python -m bench.speed.answer_embeddings --busy 0,2 --rounds 10

An answer embeds, with the sentence scorer (all-MiniLM-L6-v2, int8 ONNX): the question, the five
papers' abstracts whole and each of their sentences. Each round takes five fresh papers of the
shipped ICML sample (no memo helps), in a new process per setting and three turns; `--busy N` runs
N processes that keep a core busy each beside it. Prints the median and worst round per setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from bench.helpers import machine_load

ROUNDS = """
import gzip, json, sys, time
from rag.backends.embedders.onnx import OnnxMiniLM
from rag.text import split_sentences
OnnxMiniLM.spinning = sys.argv[1] == "spin"
first, rounds = int(sys.argv[2]), int(sys.argv[3])
with gzip.open("tests/data/icml2026_sample.jsonl.gz", "rt", encoding="utf-8") as fh:
    papers = [json.loads(line) for line in fh]
model = OnnxMiniLM("all-MiniLM-L6-v2")
model.embed(["warm up"], truncate=True)
times = []
for i in range(first, first + rounds):
    five = papers[5 * i : 5 * i + 5]
    start = time.perf_counter()
    model.embed_query(five[0]["title"] + "?")
    model.embed([p["abstract"] for p in five], truncate=True)
    model.embed([s for p in five for s in split_sentences(p["abstract"])], truncate=True)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", default="0,2", help="busy processes beside, per pass (comma list)")
    ap.add_argument("--rounds", type=int, default=10, help="answers per setting and pass")
    args = ap.parse_args()
    for busy in [int(b) for b in args.busy.split(",")]:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            time.sleep(2 if hogs else 0)
            print(f"busy processes {busy}; {machine_load()}")
            times: dict[str, list[float]] = {"spin": [], "sleep": []}
            for first in (0, args.rounds, 2 * args.rounds):  # the settings in turn
                for setting, seen in times.items():
                    out = subprocess.run(
                        [sys.executable, "-c", ROUNDS, setting, str(first), str(args.rounds)],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    seen += json.loads(out.stdout)
            for setting, seen in times.items():
                print(
                    f"  {setting:5}  median {statistics.median(seen):.3f} s"
                    f"  worst {max(seen):.3f} s  ({len(seen)} answers)"
                )
        finally:
            for hog in hogs:
                hog.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
