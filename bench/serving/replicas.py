"""Stores as replicas of one corpus on a Chroma server: what it costs to build a store's caches from
the server, to catch up with papers another store added, and to check per question that nothing
changed.

    python -m bench.serving.replicas [--papers 5700] [--new 100] [--questions 50] [--json OUT]
    python -m bench.serving.replicas --synthetic N [--new 100]  # the caches of an empty and a stale
                                                                # store, any size


Starts `chroma run` on loopback, ingests N ICML 2026 main-track abstracts (`../shared/data`) through
store A (against embedded Chroma first, the baseline in the same run: the server also keeps each
chunk's text and its paper's metadata), then times: store B built from an empty directory (its first
question), A's catch-up after B ingests `--new` more, and the per-question check (the collection's
id and count; median of `--questions` searches with and without a server, keyword mode so the
embedder does not dominate). Prints the machine's load.

`--synthetic N` writes N abstracts of `paperlists_1987_2025.jsonl.gz` (its ~79k distinct ones, then
the same texts again under new ids) straight into a collection as one chunk each, in the layout an
ingest leaves (`rag.index.vectors.server_record`) with random unit vectors (no embedding: the build
of the caches does not read vectors), then times an empty store's first question, and its next one
after `--new` more are written.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import SHARED_DATA, machine_load, percentile, report


def _records(n: int, skip: int = 0) -> list[dict]:
    out = []
    with gzip.open(SHARED_DATA / "icml2026_main.jsonl.gz", "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < skip:
                continue
            if len(out) >= n:
                break
            out.append(json.loads(line))
    return out


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--papers", type=int, default=5700)
    ap.add_argument("--new", type=int, default=100)
    ap.add_argument("--questions", type=int, default=50)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--synthetic", type=int, default=0)
    args = ap.parse_args()
    if args.synthetic:
        return synthetic(args.synthetic, args.new, args.json)

    from rag import RAG
    from tests.harness import start_chroma_server

    print(f"before: {machine_load()}")
    result: dict = {"papers": args.papers, "new": args.new}
    with tempfile.TemporaryDirectory(
        prefix="rag-replicas-", dir="/work" if Path("/work").is_dir() else None
    ) as tmp:
        root = Path(tmp)
        corpus, more = root / "corpus.jsonl", root / "more.jsonl"
        # the file holds 5,862: the new ones are its last, if need be
        records = _records(args.papers + args.new)
        if len(records) < args.papers + args.new:
            raise SystemExit(
                f"--papers {args.papers} + --new {args.new} is more than the {len(records)} records"
            )
        corpus.write_text("".join(json.dumps(r) + "\n" for r in records[: args.papers]))
        more.write_text("".join(json.dumps(r) + "\n" for r in records[args.papers :]))
        queries = [r["title"] for r in _records(args.questions, skip=args.papers // 2)]

        embedded = RAG(store_dir=root / "embedded", llm="none")
        _, result["ingest_embedded_s"] = _timed(
            lambda: embedded.ingest([corpus], include_corpus=False)
        )
        server = start_chroma_server(root / "chroma")
        try:
            shared = {"chroma_url": server.url, "collection": "bench-replicas", "llm": "none"}
            a = RAG(store_dir=root / "a", **shared)
            _, result["ingest_server_s"] = _timed(lambda: a.ingest([corpus], include_corpus=False))
            b = RAG(store_dir=root / "b", **shared)
            _, result["empty_replica_first_question_s"] = _timed(
                lambda: b.search(queries[0], k=5, mode="bm25")
            )
            result["empty_replica_catch_up_s"] = b.caught_up.seconds if b.caught_up else None
            result["empty_replica_abstracts"] = b.caught_up.abstracts if b.caught_up else 0
            b.ingest([more], include_corpus=False)
            _, result["stale_replica_first_question_s"] = _timed(
                lambda: a.search(queries[1], k=5, mode="bm25")
            )
            result["stale_replica_catch_up_s"] = a.caught_up.seconds if a.caught_up else None
            result["stale_replica_abstracts"] = a.caught_up.abstracts if a.caught_up else 0
            level = [_timed(lambda q=q: a.search(q, k=5, mode="bm25"))[1] * 1000 for q in queries]
            alone = [
                _timed(lambda q=q: embedded.search(q, k=5, mode="bm25"))[1] * 1000 for q in queries
            ]
            result["search_ms_p50_server_replica"] = percentile(level, 50)
            result["search_ms_p50_embedded"] = percentile(alone, 50)
            checks = [_timed(a.store.server_state)[1] * 1000 for _ in range(args.questions)]
            result["state_check_ms_p50"] = percentile(checks, 50)
        finally:
            server.stop()
    result["load_after"] = machine_load()
    report(result, args.json)
    return 0


def synthetic(n: int, new: int, out: Path | None) -> int:
    import hashlib
    import itertools
    import resource

    import chromadb
    import numpy as np
    from chromadb.config import Settings as ChromaSettings

    from rag import RAG
    from rag.index.corpus import Paper
    from rag.index.store import Chunk
    from rag.index.vectors import CHROMA_MAX_BATCH, server_record
    from tests.harness import start_chroma_server

    print(f"before: {machine_load()}")
    result: dict = {"synthetic_abstracts": n, "new": new}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(
        prefix="rag-replicas-", dir="/work" if Path("/work").is_dir() else None
    ) as tmp:
        root = Path(tmp)
        server = start_chroma_server(root / "chroma")
        try:
            client = chromadb.HttpClient(
                host=server.host,
                port=server.port,
                settings=ChromaSettings(anonymized_telemetry=False),
            )
            col = client.get_or_create_collection(
                "bench-synthetic",
                embedding_function=None,
                configuration={"hnsw": {"space": "cosine"}},
                metadata={"rag_embedding_model": "all-MiniLM-L6-v2"},
            )

            def write(rows, n: int) -> None:
                while n > 0:
                    part = list(itertools.islice(rows, min(n, CHROMA_MAX_BATCH)))
                    n -= len(part)
                    chunks = [
                        Chunk(
                            f"{r['id']}:{hashlib.sha1(r['abstract'].encode()).hexdigest()[:16]}:0",
                            r["id"],
                            hashlib.sha1(r["abstract"].encode()).hexdigest()[:16],
                            0,
                            f"{r.get('title', '')}\n{r['abstract']}",
                            r["abstract"],
                        )
                        for r in part
                    ]
                    papers = {
                        r["id"]: Paper(
                            r["id"],
                            r.get("title", ""),
                            "",
                            [],
                            r.get("url"),
                            r.get("venue"),
                            str(r.get("year") or "") or None,
                        )
                        for r in part
                    }
                    vectors = rng.standard_normal((len(chunks), 384)).astype(np.float32)
                    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                    col.upsert(
                        ids=[c.chunk_id for c in chunks],
                        embeddings=vectors,
                        documents=[c.text for c in chunks],
                        metadatas=[
                            server_record(c, papers[c.paper_id], {(c.paper_id, c.abstract_hash): 1})
                            for c in chunks
                        ],
                    )

            with gzip.open(
                SHARED_DATA / "paperlists_1987_2025.jsonl.gz", "rt", encoding="utf-8"
            ) as fh:
                seen: set[str] = set()  # the file repeats some records: one chunk id once
                distinct = [
                    r
                    for r in map(json.loads, fh)
                    if r.get("abstract")
                    and r.get("id")
                    and not (r["id"] in seen or seen.add(r["id"]))
                ]
            # It holds ~79k distinct abstracts: past them, the same texts again under new ids.
            rows = (
                {**r, "id": f"{r['id']}~{lap}" if lap else r["id"]}
                for lap in itertools.count()
                for r in distinct
            )
            start = time.perf_counter()
            write(rows, n)
            result["write_s"] = time.perf_counter() - start
            replica = RAG(
                store_dir=root / "replica",
                chroma_url=server.url,
                collection="bench-synthetic",
                llm="none",
            )
            start = time.perf_counter()
            replica.search("graph neural networks for molecules", k=5, mode="bm25")
            result["empty_replica_first_question_s"] = time.perf_counter() - start
            result["catch_up_s"] = replica.caught_up.seconds if replica.caught_up else None
            result["abstracts"] = replica.caught_up.abstracts if replica.caught_up else 0
            result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            start = time.perf_counter()
            replica.search("diffusion models for protein design", k=5, mode="bm25")
            result["next_question_s"] = time.perf_counter() - start
            write(rows, new)  # another store's ingest: this one is stale
            start = time.perf_counter()
            replica.search("contrastive learning for speech", k=5, mode="bm25")
            result["stale_replica_question_s"] = time.perf_counter() - start
            result["stale_catch_up_s"] = replica.caught_up.seconds if replica.caught_up else None
            result["stale_catch_up_abstracts"] = (
                replica.caught_up.abstracts if replica.caught_up else 0
            )
        finally:
            server.stop()
    result["load_after"] = machine_load()
    report(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
