#!/usr/bin/env python3
"""Finished study: nomic-embed-text-v1.5 embeds too slowly to be the default; an option
(docs/retrieval.md).

nomic-embed-text-v1.5 (torch, bf16 where the CPU has it) against the all-MiniLM-L6-v2 runtimes, in
one run: embedding throughput on the same abstracts as the ingest splits them, and question latency.

  python -m bench.studies.nomic_embed [--papers 500] [--questions 60]

Each embedder splits the first --papers ICML 2026 abstracts with its own token counter (as the
ingest does: title + piece, chunk size 240) and embeds the chunks in the ingest's batches (~64
papers' chunks per call). Reported: load time, wall and process CPU seconds, abstracts and chunks
per wall second; then `embed_query` latency over the first --questions questions of
eval/seed_questions.jsonl (p50, p95 by nearest rank, warm: after one question). `uptime` is printed
beside each figure: another process may be using the CPU, and wall figures are only comparable
within one run. Needs `bash scripts/install_nomic.sh`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.helpers import REPO, SHARED_DATA, machine_load, percentile
from rag.config import Settings
from rag.index.chunking import split_record
from rag.index.corpus import record_from_row

DATA = SHARED_DATA / "icml2026_main.jsonl.gz"


def embedders(names: list[str]):
    """(label, embedder) for each name, made but not loaded."""
    from rag.backends.embedders.nomic import NomicEmbed
    from rag.backends.embedders.onnx import OnnxMiniLM, OnnxMiniLMBulk
    from rag.backends.embedders.torch_encoders import TorchMiniLM

    made: dict[str, tuple[str, Callable[[], Any]]] = {
        "minilm-onnx": ("all-MiniLM-L6-v2 int8 ONNX (query session, the default)", OnnxMiniLM),
        "minilm-onnx-bulk": (
            "all-MiniLM-L6-v2 int8 ONNX bulk (ingest of 300+ without [fast])",
            OnnxMiniLMBulk,
        ),
        "minilm-torch": ("all-MiniLM-L6-v2 torch bf16 (ingest of 300+ with [fast])", TorchMiniLM),
        "nomic": ("nomic-embed-text-v1.5 torch bf16", lambda: NomicEmbed(Settings())),
        "nomic-fp32": (
            "nomic-embed-text-v1.5 torch fp32",
            lambda: NomicEmbed(Settings(), bf16=False),
        ),
    }
    return [(made[n][0], made[n][1]()) for n in names]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--papers", type=int, default=500)
    p.add_argument("--questions", type=int, default=60)
    p.add_argument("--embedders", default="minilm-onnx,minilm-onnx-bulk,minilm-torch,nomic")
    args = p.parse_args(argv)
    rows = []
    questions = [
        json.loads(line)["question"] for line in (REPO / "eval/seed_questions.jsonl").open()
    ]
    questions = questions[: args.questions]
    for label, model in embedders(args.embedders.split(",")):
        records = []
        with gzip.open(DATA, "rt", encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                rec = record_from_row(json.loads(line), f"icml:{i}", True)
                if rec:
                    records.append(rec)
                if len(records) >= args.papers:
                    break
        start = time.perf_counter()
        model.embed(["warm-up"])
        load_s = time.perf_counter() - start
        texts = [
            t
            for rec in records
            for t in split_record(rec, 240, 30, model.count_tokens, model.max_tokens)
        ]
        batches = [texts[i : i + 96] for i in range(0, len(texts), 96)]
        before = machine_load()
        t0, c0 = time.perf_counter(), time.process_time()
        for batch in batches:
            model.embed(batch)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        model.embed_query(questions[0])
        latencies = []
        for q in questions:
            s = time.perf_counter()
            model.embed_query(q)
            latencies.append(time.perf_counter() - s)
        row = {
            "embedder": label,
            "load_s": load_s,
            "chunks": len(texts),
            "wall_s": wall,
            "cpu_s": cpu,
            "papers_per_s": len(records) / wall,
            "papers_per_cpu_s": len(records) / cpu,
            "query_p50_ms": 1000 * percentile(latencies, 50),
            "query_p95_ms": 1000 * percentile(latencies, 95),
            "load_before": before,
            "load_after": machine_load(),
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(
        f"{args.papers} ICML abstracts, {len(questions)} questions; 1-minute load average before /"
        " after each embedder"
    )
    print(
        "| embedder | load s | chunks | wall s | CPU s | abstracts/s | abstracts/CPU-s | query p50"
        " / p95 ms | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['embedder']} | {r['load_s']:.1f} | {r['chunks']} | {r['wall_s']:.0f} |"
            f" {r['cpu_s']:.0f} | {r['papers_per_s']:.1f} | {r['papers_per_cpu_s']:.2f} |"
            f" {r['query_p50_ms']:.1f} / {r['query_p95_ms']:.1f} | {r['load_before'].split()[1]} /"
            f" {r['load_after'].split()[1]} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
