"""The store's vectors behind one interface (`rag.index.vectors.Vectors`): the in-memory variant
ranks as embedded Chroma does, `Store` delegates to whichever it holds, and nothing outside
rag/index/ reaches into them or into the store's private methods."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from rag import RAG
from rag.config import Settings
from rag.errors import StoreError
from rag.index.memory_vectors import MemoryVectors
from rag.index.store import Chunk, Store
from rag.index.vectors import EmbeddedChroma
from rag.testing import HashEmbedder

RAG_DIR = Path(__file__).resolve().parents[1] / "rag"


def _rag(store_dir: Path, memory: bool) -> RAG:
    rag = RAG(store_dir=store_dir, llm="none", embedder=HashEmbedder())
    if memory:
        rag.store = Store(rag.settings, vectors=MemoryVectors())
    return rag


def _same_ranking(chroma: RAG, memory: RAG, queries: list[str], n: int) -> None:
    for query in queries:
        vector = chroma.embedder.embed_query(query)
        want, got = chroma.store.dense_search(vector, n), memory.store.dense_search(vector, n)
        assert want and got
        assert [rowid for rowid, _ in got] == [rowid for rowid, _ in want], query
        assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-4), query
        top = [h.paper_id for h in chroma.search(query, k=3, mode="dense")]
        assert [h.paper_id for h in memory.search(query, k=3, mode="dense")] == top, query


def test_memory_vectors_rank_the_small_corpus_as_embedded_chroma_does(tmp_path, small_corpus):
    chroma, memory = _rag(tmp_path / "chroma", False), _rag(tmp_path / "memory", True)
    for rag in (chroma, memory):
        assert rag.ingest([small_corpus], include_corpus=False).new_papers == 3
    assert isinstance(chroma.store.vector_index, EmbeddedChroma)
    assert not (tmp_path / "memory" / "chroma").exists()  # nothing of Chroma on disk
    assert memory.store.vector_count() == chroma.store.vector_count() == 4
    _same_ranking(
        chroma,
        memory,
        [
            "sparse mixture of experts routing",
            "protein structure diffusion",
            "graph transformers for molecular properties",
        ],
        n=4,
    )
    hits = memory.search("protein folding diffusion", k=1, mode="hybrid")
    assert hits[0].paper_id == "BBBBBBBBB2" and hits[0].retrieval.cosine is not None


def test_memory_vectors_rank_the_seed_corpus_as_embedded_chroma_does(tmp_path):
    """76 papers: exact cosine search and Chroma's HNSW index agree on the ten nearest chunks."""
    chroma, memory = _rag(tmp_path / "chroma", False), _rag(tmp_path / "memory", True)
    for rag in (chroma, memory):
        assert rag.ingest(include_corpus=True).new_papers == 76
    _same_ranking(
        chroma,
        memory,
        [
            "state space models with selective memory",
            "diffusion models for images",
            "reinforcement learning from human feedback",
            "graph neural networks",
        ],
        n=10,
    )


def test_the_store_delegates_to_its_vectors(tmp_path):
    vectors = MemoryVectors()
    store = Store(Settings(store_dir=tmp_path / "s"), vectors=vectors)
    assert store.vector_index is vectors and store.server is None
    assert store.server_state() is None and store.sparse_search("anything", 3) is None
    assert not store.server_keyword_search() and store.sparse_unavailable is None
    with pytest.raises(StoreError, match="not in Chroma"):
        store.collection()
    store.init_meta("test-hash-embedder")
    chunks = [Chunk(f"P{i}:h:0", f"P{i}", "h", 0, f"text {i}", f"text {i}") for i in range(3)]
    store.add([], chunks, [[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    assert store.quick_check() == "ok" and store.vector_count() == 3

    found = store.dense_search([1.0, 0.1], 2)
    assert found is not None and [rowid for rowid, _ in found] == [1, 2]
    assert store.vectors(["P2:h:0", "P0:h:0"]).tolist() == [[0.0, 1.0], [1.0, 0.0]]
    with pytest.raises(StoreError, match="1 indexed chunks have no vector"):
        store.vectors(["P0:h:0", "nope"])
    assert store.similarities([0.0, 2.0], ["P1:h:0", "nope"]) == {"P1:h:0": pytest.approx(0.8)}
    store.close()  # closing lets go of clients; the vectors stay
    assert store.vector_count() == 3 and not store.vectors_gone()

    vectors.write(chunks[:1], [[1.0, 0.0]])  # an upsert replaces, a vector without a row is skipped
    vectors.write([Chunk("ORPHAN:h:0", "ORPHAN", "h", 0, "", "")], [[1.0, 0.0]])
    found = store.dense_search([1.0, 0.0], 4)
    assert found is not None and [rowid for rowid, _ in found] == [1, 2, 3]

    vectors.drop()  # rows without vectors: keywords answer, and the fix is named
    assert store.vectors_gone()
    assert store.dense_search([1.0, 0.0], 2) is None
    assert (
        store.vectors_unavailable
        and "holds no vectors for its 3 chunks" in store.vectors_unavailable
    )
    assert store.similarities([1.0, 0.0], ["P0:h:0"]) == {}


def test_nothing_outside_the_index_reaches_into_the_store():
    """Chroma is imported in rag/index/vectors.py alone (tests/test_architecture.py); the store's
    private methods are called from rag/index/ alone."""
    private = re.compile(r"store\._[a-z]|\._db\(\)")
    offenders = [
        f"{path.relative_to(RAG_DIR.parent)}:{n}: {line.strip()}"
        for path in sorted(RAG_DIR.rglob("*.py"))
        if "index" not in path.relative_to(RAG_DIR).parts[:1]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == []
