"""Keyword ranking on a Chroma server with a sparse index against the local BM25 cache: do both give
the same top-10 papers?

    python -m bench.retrieval.server_sparse --store DIR [--questions eval/user_questions.jsonl ...]
[--json OUT]

Chroma's sparse index runs only on its distributed deployment (and Chroma Cloud); `chroma run` and
embedded Chroma refuse it, so the server's ranking is EMULATED here, with its documented parts: each
chunk's term weights are what Chroma's client sends on upsert (`ChromaBm25EmbeddingFunction`, as
`rag.index.vectors. sparse_schema` configures it: k1 1.2, b 0.75, a fixed average length of 256
tokens, Snowball stemming, its stopwords), and the server (`bm25=True`) scores a chunk by the sum
over the query's distinct terms of Lucene's smoothed IDF, ln(1 + (N - df + 0.5) / (df + 0.5)), times
the chunk's weight. The emulated ranking goes through the product's own retrieval
(`rag.retrieve.search.search`, its `sparse_search` seam), so fusion, the rare-name boost and
grouping by paper are the product's in both columns.

Per question file and mode (bm25, hybrid), over the questions whose expected paper the store holds:
mean overlap of the two top-10 paper lists, the share of questions whose top-10 sets are equal, and
hit@1 / hit@10 of the expected paper under each ranking.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

from bench.helpers import REPO, machine_load, report


class EmulatedServerBm25:
    """Chroma's BM25 sparse search over one store's chunks, computed here (see the module
    docstring)."""

    def __init__(self, store) -> None:
        from chromadb.utils.embedding_functions import ChromaBm25EmbeddingFunction

        self.ef = ChromaBm25EmbeddingFunction()
        rows = list(store._db().execute("SELECT rowid, text FROM chunks ORDER BY rowid"))
        self.postings: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for start in range(0, len(rows), 512):
            part = rows[start : start + 512]
            for (rowid, _), vector in zip(part, self.ef([text for _, text in part])):
                for term, weight in zip(vector.indices, vector.values):
                    self.postings[term].append((rowid, weight))
        self.n = len(rows)

    def search(self, query: str, n: int) -> list[tuple[int, float]]:
        scores: dict[int, float] = defaultdict(float)
        for term in set(self.ef.embed_query([query])[0].indices):
            posting = self.postings.get(term, [])
            idf = math.log(1 + (self.n - len(posting) + 0.5) / (len(posting) + 0.5))
            for rowid, weight in posting:
                scores[rowid] += idf * weight
        return sorted(scores.items(), key=lambda kv: -kv[1])[:n]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument(
        "--questions",
        type=Path,
        nargs="+",
        default=[REPO / "eval/user_questions.jsonl", REPO / "eval/seed_questions.jsonl"],
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rag import RAG
    from rag.retrieve.search import search

    print(f"before: {machine_load()}")
    rag = RAG(store_dir=args.store, llm="none")
    store = rag.store
    start = time.perf_counter()
    server = EmulatedServerBm25(store)
    result: dict = {
        "chunks": server.n,
        "emulated_index_build_s": round(time.perf_counter() - start, 1),
    }

    def ranked(question: str, mode: str, on_server: bool) -> list[str]:
        store.server_keyword_search = lambda: on_server  # type: ignore[method-assign]
        store.sparse_search = server.search  # type: ignore[method-assign]
        return [
            h.paper.paper_id for h in search(store, rag.embedder, question, 10, mode, rag.settings)
        ]

    for path in args.questions:
        questions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        held = {pid for (pid,) in store._db().execute("SELECT DISTINCT paper_id FROM chunks")}
        answerable = [q for q in questions if q.get("gold")]
        # hit rates only where the store holds it
        questions = [q for q in answerable if set(q["gold"]) & held]
        result[f"{path.stem}_gold_not_in_store"] = len(answerable) - len(questions)
        for mode in ("bm25", "hybrid"):
            overlap, equal, hits = [], 0, {"local": [0, 0], "server": [0, 0]}
            for q in questions:
                local, remote = (
                    ranked(q["question"], mode, False),
                    ranked(q["question"], mode, True),
                )
                overlap.append(len(set(local) & set(remote)) / max(len(local), 1))
                equal += set(local) == set(remote)
                for name, top in (("local", local), ("server", remote)):
                    hits[name][0] += bool(top[:1] and top[0] in q["gold"])
                    hits[name][1] += bool(set(top) & set(q["gold"]))
            key = f"{path.stem}_{mode}"
            n = len(questions)
            result[f"{key}_questions"] = n
            result[f"{key}_top10_overlap_mean"] = round(sum(overlap) / n, 3)
            result[f"{key}_top10_same_set"] = round(equal / n, 3)
            for name in ("local", "server"):
                result[f"{key}_hit@1_{name}"] = round(hits[name][0] / n, 3)
                result[f"{key}_hit@10_{name}"] = round(hits[name][1] / n, 3)
    result["load_after"] = machine_load()
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
