#!/usr/bin/env python3
"""Where a warm hybrid query's time goes: each stage of `rag.retrieve.search.search`, timed alone.

  python -m bench.speed.query_stages --store DIR [--repeats 5]

Stages, per question (the scale benchmark's 40 questions, one warm-up pass first): the query's
embedding, Chroma's nearest-neighbour query (with the rowid lookup), the BM25 search, the rare-name
lookup, the rows of the fused candidates, and the whole `RAG.search` call. Prints p50/p95 (nearest
rank) in ms.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.helpers import machine_load, percentile
from bench.speed.scale import QUESTIONS
from rag import RAG
from rag.retrieve.search import RARE_NAME_MAX_PAPERS


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - start) * 1000


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rag = RAG(store_dir=args.store, llm="none")
    store, n = rag.store, max(rag.settings.candidates, 15)
    _, cold = timed(rag.search, QUESTIONS[0], 5)
    print(f"first search (loads the model, Chroma and the keyword index): {cold:.0f} ms")
    times: dict[str, list[float]] = {}
    for rep in range(args.repeats + 1):
        for q in QUESTIONS:
            vector, t_embed = timed(rag.embedder.embed_query, q)
            dense, t_dense = timed(store.dense_search, vector, n)
            keyword, t_index = timed(store.keyword_index)
            _, t_bm25 = timed(keyword.search, q, n)
            _, t_rare = timed(
                keyword.rare_term_keys,
                q,
                lambda rowids: [c.paper_id for c in store.chunks_by_rowid(rowids).values()],
                RARE_NAME_MAX_PAPERS,
            )
            _, t_rows = timed(store.chunks_by_rowid, [r for r, _ in dense or []])
            _, t_all = timed(rag.search, q, 5)
            if rep:  # the first pass warms caches
                for name, t in [
                    ("embed query", t_embed),
                    ("dense (Chroma)", t_dense),
                    ("keyword index fetch", t_index),
                    ("bm25 search", t_bm25),
                    ("rare names", t_rare),
                    ("candidate rows", t_rows),
                    ("RAG.search total", t_all),
                ]:
                    times.setdefault(name, []).append(t)
    print(
        f"{'stage':<22} {'p50 ms':>8} {'p95 ms':>8}   ({len(QUESTIONS)} questions x {args.repeats};"
        f" {machine_load()})"
    )
    for name, ts in times.items():
        print(f"{name:<22} {percentile(ts, 50):8.2f} {percentile(ts, 95):8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
