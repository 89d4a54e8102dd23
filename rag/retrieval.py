"""Hybrid retrieval: dense (Chroma) and BM25 over the same chunks, fused by reciprocal rank
fusion, grouped so each paper appears once with its best chunk.

`PaperRetriever` exposes it as a LlamaIndex `BaseRetriever` so it composes with LlamaIndex.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import RETRIEVAL_MODES
from .errors import InputError
from .store import ChunkRow, PaperRow, Store


@dataclass
class Hit:
    """One retrieved paper with its best chunk."""

    paper: PaperRow
    chunk: ChunkRow
    score: float  # 0..1, higher is better
    similarity: float | None  # best dense cosine similarity of the paper's chunks, when known
    named: bool = False  # the query names a term rare in the corpus that this paper's chunk holds


def check_mode(mode: str) -> str:
    if mode not in RETRIEVAL_MODES:
        raise InputError(f"unknown retrieval mode {mode!r}; use one of: {', '.join(RETRIEVAL_MODES)}")
    return mode


def check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise InputError(f"k must be a whole number, got {k!r}")
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    return min(k, 100)


# A name used by at most this many papers marks the question as about them (see rare_term_keys).
RARE_NAME_MAX_PAPERS = 5


def search(store: Store, embedder, query: str, k: int, mode: str, candidates: int, rrf_k: int,
           name_boost: float = 2.0) -> list[Hit]:
    """Top-k papers for the query, best first."""
    check_mode(mode)
    n = max(candidates, 3 * k)
    lists: list[tuple[float, list[int]]] = []
    similarity: dict[int, float] = {}
    if mode in ("dense", "hybrid"):
        dense = store.dense_search(embedder.embed_query(query), n)
        similarity = dict(dense)
        lists.append((1.0, [rowid for rowid, _ in dense]))
    keyword = store.keyword_index()
    rare = keyword.rare_term_keys(
        query, lambda rowids: [c.paper_id for c in store.chunks_by_rowid(rowids).values()], RARE_NAME_MAX_PAPERS)
    if mode in ("bm25", "hybrid"):
        # A question that names something rare in the corpus (a method name) is best matched by
        # its keywords: the embedding model has never seen the name.
        ranking = [rowid for rowid, _ in keyword.search(query, n)]
        lists.append((1.0, ranking))
        if rare:
            lists.append((name_boost - 1.0, [rowid for rowid in ranking if rowid in rare]))
    fused: dict[int, float] = {}
    for weight, ranking in lists:
        for rank, rowid in enumerate(ranking):
            fused[rowid] = fused.get(rowid, 0.0) + weight / (rrf_k + rank + 1)
    best_possible = sum(weight for weight, _ in lists) / (rrf_k + 1)
    ordered = sorted(fused, key=lambda r: -fused[r])
    chunks = store.chunks_by_rowid(ordered)
    best: dict[str, int] = {}
    paper_sim: dict[str, float] = {}
    for rowid in ordered:
        chunk = chunks.get(rowid)
        if chunk is None:
            continue
        best.setdefault(chunk.paper_id, rowid)
        if rowid in similarity:
            paper_sim[chunk.paper_id] = max(paper_sim.get(chunk.paper_id, -1.0), similarity[rowid])
    top = list(best.items())[:k]
    papers = store.papers([pid for pid, _ in top])
    return [
        Hit(papers[pid], chunks[rowid], round(fused[rowid] / best_possible, 4), paper_sim.get(pid),
            named=rowid in rare)
        for pid, rowid in top if pid in papers
    ]


def make_llamaindex_retriever(rag, k: int | None = None, mode: str | None = None):
    """A LlamaIndex `BaseRetriever` over this index (built lazily: llama_index is a heavy import)."""
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    class PaperRetriever(BaseRetriever):
        """Hybrid (BM25 + dense, RRF) paper retriever: one node per paper, its best chunk."""

        def __init__(self) -> None:
            super().__init__()
            self.k = k or rag.settings.top_k
            self.mode = check_mode(mode or rag.settings.mode)

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            hits = rag.retrieve(query_bundle.query_str, k=self.k, mode=self.mode)
            return [NodeWithScore(node=hit_to_node(h, TextNode), score=h.score) for h in hits]

    return PaperRetriever()


def hit_to_node(hit: Hit, node_cls):
    return node_cls(
        id_=hit.chunk.chunk_id,
        text=hit.chunk.text,
        metadata={
            "paper_id": hit.paper.paper_id, "title": hit.paper.display_title,
            "authors": ", ".join(hit.paper.authors), "url": hit.paper.url or "",
            "similarity": hit.similarity,
        },
        excluded_embed_metadata_keys=["authors", "url", "similarity"],
        excluded_llm_metadata_keys=["authors", "url", "similarity"],
    )
