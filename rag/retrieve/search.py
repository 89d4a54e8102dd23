"""Hybrid retrieval: dense (Chroma) and BM25 over the same chunks, fused by reciprocal rank
fusion or a convex combination of scores, grouped so each paper appears once with its best chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rag.config import MPNET_EMBED_MODEL, Settings, check_mode, dense_weight_for
from rag.index.corpus import Paper
from rag.index.store import ChunkRow, Store


@dataclass
class Hit:
    """One retrieved paper with its best chunk."""

    paper: Paper
    chunk: ChunkRow
    score: float  # 0..1, higher is better
    similarity: float | None  # best dense cosine similarity of the paper's chunks, when known
    named: bool = False  # the query names a term rare in the corpus that this paper's chunk holds
    # What the order is made of, for the chunk shown: the fused score the hits are sorted by (0..1,
    # 1 = the best possible), and the two matches fused: its cosine (None: vectors unreadable) and
    # its BM25.
    fused: float = 0.0
    cosine: float | None = None
    keyword: float = 0.0

    @property
    def title_and_abstract(self) -> str:
        """What the answer's rules judge a paper by: its title and the abstract it was retrieved
        with (a paper may have several versions of its abstract)."""
        return f"{self.paper.title} {self.chunk.abstract}"


# A name used by at most this many papers marks the question as about them (see rare_term_keys).
RARE_NAME_MAX_PAPERS = 5


def fusion_for(mode: str, embed_model: str) -> str | None:
    """How a mode fuses dense and BM25: None (one list), "rrf" or "convex".

    Plain `hybrid` is convex for all-mpnet-base-v2, whose strong similarities are worth counting,
    and reciprocal rank otherwise: among thousands of papers MiniLM's similarities say less than
    its ranks (measured in docs/retrieval.md).
    """
    if not mode.startswith("hybrid"):
        return None
    if mode != "hybrid":
        return mode.removeprefix("hybrid-")
    return "convex" if embed_model == MPNET_EMBED_MODEL else "rrf"


def order_legend(mode: str, embed_model: str) -> str:
    """One line saying what a list of results is sorted by and what its other numbers are, for the
    readers who see them side by side (the CLI, the UI): the order follows the fused score, not the
    cosine printed beside it."""
    fusion = fusion_for(mode, embed_model)
    how = (
        "reciprocal rank fusion of the keyword and meaning rankings"
        if fusion == "rrf"
        else "a blend of the keyword and meaning scores, each scaled to 0..1"
        if fusion == "convex"
        else "the keyword ranking"
        if mode == "bm25"
        else "the meaning ranking"
    )
    return (
        f"Sorted by fused score ({how}; 1 = the best possible). "
        "cosine: meaning similarity of the passage to the query; keyword: its BM25 word match."
    )


def rrf_fusion(
    dense, keyword_hits, rare: set[int], rrf_k: int, name_boost: float
) -> tuple[dict[int, float], float]:
    """Reciprocal rank fusion of the lists present: chunk rowid -> score, and the best possible
    score."""
    lists = [(1.0, [rowid for rowid, _ in hits]) for hits in (dense, keyword_hits) if hits]
    if keyword_hits and rare:
        lists.append((name_boost - 1.0, [rowid for rowid, _ in keyword_hits if rowid in rare]))
    fused: dict[int, float] = {}
    for weight, ranking in lists:
        for rank, rowid in enumerate(ranking):
            fused[rowid] = fused.get(rowid, 0.0) + weight / (rrf_k + rank + 1)
    return fused, max(sum(weight for weight, _ in lists), 1e-9) / (rrf_k + 1)


def convex_fusion(
    dense, keyword_hits, rare: set[int], dense_weight: float, name_boost: float
) -> tuple[dict[int, float], float]:
    """dense_weight x similarity + (1 - dense_weight) x BM25, each min-max scaled over its
    candidates (a chunk missing from a list scores that list's minimum, 0), as in Bruch et al. 2023,
    "An Analysis of Fusion Functions for Hybrid Retrieval"; keyword matches of a rare name get
    name_boost - 1 more."""

    def scaled(hits):
        if not hits:
            return {}
        lo, hi = min(s for _, s in hits), max(s for _, s in hits)
        return {rowid: (s - lo) / (hi - lo) if hi > lo else 1.0 for rowid, s in hits}

    d, b = scaled(dense), scaled(keyword_hits)
    boost = name_boost - 1.0
    fused = {
        rowid: dense_weight * d.get(rowid, 0.0)
        + (1.0 - dense_weight) * b.get(rowid, 0.0)
        + (boost if rowid in rare and rowid in b else 0.0)
        for rowid in d.keys() | b.keys()
    }
    return fused, 1.0 + (boost if rare else 0.0)


def search(store: Store, embedder, query: str, k: int, mode: str, settings: Settings) -> list[Hit]:
    """Top-k papers for the query, best first."""
    check_mode(mode)
    n = max(settings.candidates, 3 * k)
    dense: list[tuple[int, float]] = []
    keyword_hits: list[tuple[int, float]] = []
    fusion = fusion_for(mode, settings.embed_model)
    vector = embedder.embed_query(query)
    if mode == "dense" or fusion:
        found = store.dense_search(vector, n)
        if found is None:  # vectors unreadable here (full disk, read-only store): keywords alone
            mode, fusion = "bm25", "rrf"
        dense = found or []
    similarity = dict(dense)
    keyword = store.keyword_index()
    rare = keyword.rare_term_keys(
        query,
        lambda rowids: [c.paper_id for c in store.chunks_by_rowid(rowids).values()],
        RARE_NAME_MAX_PAPERS,
    )
    if mode == "bm25" or fusion:
        # On a server with Chroma's sparse index the keyword ranking is the server's
        # (`sparse_search`), else (or when the server fails it) the local BM25 cache's.
        on_server = store.sparse_search(query, n) if store.server_keyword_search() else None
        keyword_hits = on_server if on_server is not None else keyword.search(query, n)
    # A question that names something rare in the corpus (a method name) is best matched by its
    # keywords: the embedding model has never seen the name. Those keyword matches get name_boost.
    if fusion == "convex":
        fused, best_possible = convex_fusion(
            dense, keyword_hits, rare, dense_weight_for(settings), settings.name_boost
        )
    else:
        fused, best_possible = rrf_fusion(
            dense, keyword_hits, rare, settings.rrf_k, settings.name_boost
        )
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
    # The score shown is the query's cosine similarity to the passage shown: its meaning holds
    # across queries ("sourdough bread" scores low everywhere), where the fused score, scaled to the
    # best possible one, put a top paper near 1 for any query. Unreadable vectors: the fused score.
    shown = {rowid: similarity[rowid] for _, rowid in top if rowid in similarity}
    missing = [chunks[rowid].chunk_id for _, rowid in top if rowid not in shown]
    by_id = store.similarities(vector, missing)
    shown.update(
        {
            rowid: by_id[chunks[rowid].chunk_id]
            for _, rowid in top
            if chunks[rowid].chunk_id in by_id
        }
    )
    # Each hit also carries what its place comes from (the fused score) and the BM25 of its passage,
    # so that a list sorted by one number never shows only another (0.18 above 0.21).
    bm25 = dict(keyword_hits)
    unscored = [rowid for _, rowid in top if rowid not in bm25]
    if unscored:
        bm25.update(keyword.scores_of(query, unscored))
    return [
        Hit(
            papers[pid],
            chunks[rowid],
            round(
                min(1.0, max(0.0, shown[rowid]))
                if rowid in shown
                else fused[rowid] / best_possible,
                4,
            ),
            paper_sim.get(pid),
            named=rowid in rare,
            fused=round(fused[rowid] / best_possible, 4),
            cosine=round(shown[rowid], 4) if rowid in shown else None,
            keyword=round(bm25[rowid], 3),
        )
        for pid, rowid in top
        if pid in papers
    ]


def rescored(hits: list[Hit], embedder, query: str, store: Store) -> list[Hit]:
    """`hits` in the same order, their cosines as `embedder` sees the question and the paper's text:
    the passage shown (its score and `cosine`) and the paper's best chunk (`similarity`). For an
    index whose model is not the one the answer rules' cosine levels were measured with
    (`sentence_scorer`)."""
    import numpy as np

    scored = [h for h in hits if h.cosine is not None]  # none: vectors unreadable, left as is
    if not scored:
        return hits
    texts = store.chunk_texts([h.paper.paper_id for h in scored])
    every = list(
        dict.fromkeys([h.chunk.text for h in scored] + [t for v in texts.values() for t in v])
    )
    question = np.asarray(embedder.embed_query(query))
    cosine = dict(
        zip(every, (np.asarray(embedder.embed(every, truncate=True)) @ question).tolist())
    )

    def read(hit: Hit) -> Hit:
        if hit.cosine is None:
            return hit
        shown = round(cosine[hit.chunk.text], 4)
        best = round(max([cosine[t] for t in texts.get(hit.paper.paper_id, [])] + [shown]), 4)
        return replace(hit, score=min(1.0, max(0.0, shown)), similarity=best, cosine=shown)

    return [read(h) for h in hits]
