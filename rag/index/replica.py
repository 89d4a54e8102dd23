"""A store as a cache of a corpus on a Chroma server (`RAG_CHROMA_URL`).

On a server the chunks carry their text, and the first chunk of each abstract its paper's metadata
(`rag.index.vectors.server_record`): the server is the corpus, and a store directory holds caches of
it (manifest, keyword index, map). `catch_up` brings them level, building them in an empty store and
adding only the missing chunks to one that fell behind; the server's state (the collection's id and
its number of chunks, which ingests only raise) takes one request per question.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag.errors import StoreError
from rag.index.corpus import Paper
from rag.index.store import Chunk

if TYPE_CHECKING:
    from rag.index.store import Store
    from rag.index.vectors import ChromaServer

# meta key: the id of the server collection the caches were built from
SERVER_COLLECTION = "server_collection"
ID_PAGE = 5000  # ids read per request
FETCH_BATCH = 500  # chunks (with text and metadata) read per request


@dataclass
class CatchUp:
    """What a catch-up did: abstracts and chunks added to the caches, whether they were dropped
    first (the collection was replaced), abstracts skipped as incomplete on the server, and the time
    it took."""

    abstracts: int = 0
    chunks: int = 0
    rebuilt: bool = False
    incomplete: int = 0
    without_text: int = 0
    seconds: float = 0.0


def catch_up(store: Store, embedding_model: str) -> CatchUp | None:
    """Bring the store's caches level with its collection on the server; None when there is nothing
    to do (no server, no such collection, already level, or another process is writing to this
    store)."""
    server = store.server
    if server is None:
        return None
    state = server.state()
    if state is None or state == store.synced_state:
        return None
    collection_id, count = state
    if (
        store.exists()
        and store.meta(SERVER_COLLECTION) == collection_id
        and store.chunk_count() == count
    ):
        store.synced_state = state
        return None
    started = time.perf_counter()
    try:
        with store.writer():
            report = _catch_up(store, server, collection_id, embedding_model)
    except StoreError as exc:
        if "another ingest is writing" in str(exc):
            return None  # that writer brings the store level; the next question looks again
        raise
    store.synced_state = store.server_state()
    report.seconds = time.perf_counter() - started
    return report


def _catch_up(
    store: Store, server: ChromaServer, collection_id: str, embedding_model: str
) -> CatchUp:
    report = CatchUp()
    if (
        store.exists()
        and store.meta(SERVER_COLLECTION) not in (None, collection_id)
        and store.chunk_count()
    ):
        store.clear_caches()  # built from a collection that was replaced (a --rebuild): start over
        report.rebuilt = True
    on_server = server.all_ids(ID_PAGE)
    have = store.chunk_ids() if store.exists() else set()
    missing = sorted(on_server - have)  # sorted: the chunks of one abstract are neighbours
    store.init_meta(server.corpus_model() or embedding_model)
    pending: dict[tuple[str, str], dict[int, tuple[str, str | None, dict]]] = {}
    for start in range(0, len(missing), FETCH_BATCH):
        for cid, text, meta in server.records(missing[start : start + FETCH_BATCH]):
            key = (str(meta.get("paper_id", "")), str(meta.get("abstract_hash", "")))
            pending.setdefault(key, {})[int(meta.get("seq", 0))] = (cid, text, meta)
        _commit_complete(store, pending, report, last=start + FETCH_BATCH >= len(missing))
    store.set_meta(SERVER_COLLECTION, collection_id)
    store.update_keyword_index()
    return report


def _commit_complete(store: Store, pending: dict, report: CatchUp, last: bool) -> None:
    """Write every abstract whose chunks have all arrived (an abstract whose first chunk says it has
    n); on the last batch, count what never completed (a killed ingest's vectors on the server)."""
    papers: list[Paper] = []
    chunks: list[Chunk] = []
    for key in list(pending):
        parts = pending[key]
        head = parts.get(0)
        n = int(head[2].get("n_chunks", 0)) if head else 0
        if head is None or len(parts) < n or n == 0:
            if last:
                report.incomplete += 1
                del pending[key]
            continue
        del pending[key]
        if any(parts[i][1] is None for i in range(n)):
            report.without_text += 1  # written by a version that kept only vectors on the server
            continue
        meta = head[2]
        abstract = str(meta.get("abstract", ""))
        authors: list[str] = []
        with contextlib.suppress(ValueError, TypeError):
            authors = list(json.loads(meta.get("authors") or "[]"))
        papers.append(
            Paper(
                key[0],
                str(meta.get("title", "")),
                str(meta.get("label", "")),
                authors,
                meta.get("url"),
                meta.get("venue"),
                meta.get("year"),
            )
        )
        chunks.extend(
            Chunk(parts[i][0], key[0], key[1], i, parts[i][1], abstract) for i in range(n)
        )
        report.abstracts += 1
        report.chunks += n
    if chunks:
        store.add_rows(papers, chunks)
