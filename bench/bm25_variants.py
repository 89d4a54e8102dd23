#!/usr/bin/env python3
"""BM25 three ways over one store's chunks, same tokenizer, same k1/b: ours (rag/index/keyword.py: segments
of raw counts, memory-mapped, appended), the previous index (one CSR of precomputed weights, rebuilt
by every ingest; from git, commit 733936e), and bm25s (a maintained sparse-matrix library).

  python -m bench.bm25_variants --store DIR [--repeats 5]      (needs `pip install bm25s`)

Per variant: build time over all chunks, query p50/p95 (nearest rank; the scale benchmark's 40 questions, top 30,
after a warm-up pass), what adding 100 chunks costs (ours appends; the others rebuild), and whether
its top 30 equal ours (same documents, scores within 1e-4).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import REPO, machine_load, percentile
from bench.scale import QUESTIONS
from rag.index.keyword import KeywordIndex
from rag.text import keyword_terms

PREVIOUS = "733936e"  # the last commit with the single-CSR index


def previous_module():
    src = subprocess.run(["git", "-C", str(REPO), "show", f"{PREVIOUS}:rag/index/keyword.py"], capture_output=True,
                         text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "keyword_previous.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("keyword_previous", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Bm25s:
    """bm25s over our tokens (k1=1.2, b=0.75, Lucene idf: the formula ours uses; Lucene's tf part leaves
    out BM25's constant (k1 + 1) factor, put back here so that scores compare)."""

    def __init__(self, rows) -> None:
        import bm25s

        self.keys = [k for k, _ in rows]
        self.model = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
        self.model.index([keyword_terms(t) for _, t in rows], show_progress=False)
        self.vocab = self.model.vocab_dict

    def search(self, query: str, n: int):
        import numpy as np

        ids = [self.vocab[t] for t in set(keyword_terms(query)) if t in self.vocab]
        if not ids:
            return []
        scores = self.model.get_scores_from_ids(ids) if hasattr(self.model, "get_scores_from_ids") else \
            self.model.get_scores(list(set(keyword_terms(query))))
        top = np.argpartition(-scores, n - 1)[:n]
        top = top[np.lexsort((top, -scores[top]))]
        return [(self.keys[i], float(scores[i]) * 2.2) for i in top if scores[i] > 0]


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    import sqlite3

    db = sqlite3.connect(f"file:{args.store / 'papers.sqlite'}?mode=ro", uri=True)
    rows = list(db.execute("SELECT rowid, text FROM chunks ORDER BY rowid"))
    base, extra = rows[:-100], rows[-100:]
    previous = previous_module()
    builders = {
        "ours (segments, appended)": (lambda r: KeywordIndex.build(r), lambda idx, r: idx.appended(r)),
        f"previous (one CSR of weights, {PREVIOUS})": (lambda r: previous.KeywordIndex.build(r),
                                                       lambda idx, r: previous.KeywordIndex.build(base + r)),
        "bm25s 0.3 (sparse matrix)": (lambda r: Bm25s(r), lambda idx, r: Bm25s(base + r)),
    }
    results, tops = {}, {}
    for name, (build, add) in builders.items():
        index, t_build = timed(build, base)
        index, t_add = timed(add, index, extra)
        for q in QUESTIONS:
            index.search(q, 30)
        times = []
        for _ in range(args.repeats):
            for q in QUESTIONS:
                _, t = timed(index.search, q, 30)
                times.append(t * 1000)
        tops[name] = [index.search(q, 30) for q in QUESTIONS]
        results[name] = (t_build, t_add, percentile(times, 50), percentile(times, 95))
        print(f"  {name}: built in {t_build:.1f} s", file=sys.stderr, flush=True)
        del index
    ours = tops[next(iter(tops))]
    print(f"{len(rows):,} chunks; {len(QUESTIONS)} questions x {args.repeats}, top 30; {machine_load()}")
    print("| variant | build (s) | add 100 chunks (s) | query p50 (ms) | query p95 (ms) | top 30 = ours |")
    print("|---|---|---|---|---|---|")
    for name, (t_build, t_add, p50, p95) in results.items():
        same = sum(len(a) == len(b) and all(ka == kb and abs(sa - sb) < 1e-4 for (ka, sa), (kb, sb) in zip(a, b))
                   for a, b in zip(tops[name], ours))
        print(f"| {name} | {t_build:.1f} | {t_add:.2f} | {p50:.2f} | {p95:.2f} | {same}/{len(QUESTIONS)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
