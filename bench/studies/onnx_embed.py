#!/usr/bin/env python3
"""Finished study: ingests run ONNX 1 thread x 2 streams (OnnxMiniLMBulk);
bench/results/issue18_onnx_embed.txt.

The default embedder's ingest speed, tuned: all-MiniLM-L6-v2 int8 ONNX under several ONNX Runtime
settings against the torch bf16 path (the `[fast]` extra), on the same chunks, in one run.

  python -m bench.studies.onnx_embed [--chunks 1500] [--rounds 2]

Texts: the first --chunks chunks of ICML 2026 abstracts, as the ingest splits them. Each variant
embeds them all (the ingest's call, `embed(texts)` in batches of 64 papers' chunks), rounds
interleaved; reported: wall and process CPU seconds (best round), chunks per wall second, and the
ratio to torch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time

from bench.helpers import SHARED_DATA, machine_load
from rag.backends.embedders import MINILM_MAX_TOKENS
from rag.backends.embedders.onnx import OnnxMiniLM
from rag.index.chunking import split_record
from rag.index.corpus import record_from_row

DATA = SHARED_DATA / "icml2026_main.jsonl.gz"


def variant(name: str, **attrs):
    cls = type(name, (OnnxMiniLM,), attrs)
    return name, cls


VARIANTS = [
    variant("onnx default (before)", threads=0, spinning=True, batch_size=4, streams=1),
    variant("onnx 2 threads, no spin", threads=2, spinning=False, batch_size=4, streams=1),
    variant(
        "onnx 2 threads, no spin, batch 16", threads=2, spinning=False, batch_size=16, streams=1
    ),
    variant(
        "onnx 1 thread x 2 streams, batch 8", threads=1, spinning=False, batch_size=8, streams=2
    ),
    variant(
        "onnx 1 thread x 2 streams, batch 4", threads=1, spinning=False, batch_size=4, streams=2
    ),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args(argv)
    counter = OnnxMiniLM()
    texts: list[str] = []
    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            rec = record_from_row(json.loads(line), f"icml:{i}", True)
            if rec:
                texts += split_record(rec, 240, 30, counter.count_tokens, MINILM_MAX_TOKENS)
            if len(texts) >= args.chunks:
                break
    texts = texts[: args.chunks]
    # ~64 papers' chunks, as the ingest
    batches = [texts[i : i + 96] for i in range(0, len(texts), 96)]
    models = [(name, cls()) for name, cls in VARIANTS]
    if not args.no_torch:
        from rag.backends.embedders.torch_encoders import TorchMiniLM

        models.append(("torch bf16 ([fast] extra)", TorchMiniLM()))
    for _, m in models:
        m.embed(texts[:8])  # load
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for name, m in models:
            t0, c0 = time.perf_counter(), time.process_time()
            for b in batches:
                m.embed(b)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if name not in best or wall < best[name][0]:
                best[name] = (wall, cpu)
            print(f"  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    ref = best.get("torch bf16 ([fast] extra)", best[VARIANTS[0][0]])[0]
    print(f"{len(texts)} chunks, best of {args.rounds} rounds; {machine_load()} (at the end)")
    print("| variant | wall s | CPU s | chunks/s | wall / torch |\n|---|---|---|---|---|")
    for name, (wall, cpu) in best.items():
        print(f"| {name} | {wall:.1f} | {cpu:.1f} | {len(texts) / wall:.0f} | {wall / ref:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
