"""The vectors of a store: embedded Chroma under `store/chroma/` or a Chroma server (`RAG_CHROMA_URL`); the
only module that imports chromadb. `ChromaVectors` is the vectors' half of `rag.index.store.Store` (which
inherits it): opening the client and collection, writing and dropping vectors, nearest-neighbour search,
and the one-line errors of a full disk, a read-only store or damaged files (questions then fall back to
keyword retrieval, and `rag repair` re-indexes from papers.sqlite)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from rag.config import Settings, redact_url
from rag.errors import InputError, StoreError

CHROMA_MAX_BATCH = 5000  # Chroma accepts at most 5,461 records per write
DEFAULT_COLLECTION = "papers"
# Collection metadata keys naming the stores that write into a collection on a server (see `register_replica`).
REPLICA_KEY = "rag_replica_"
# The key of Chroma's BM25 sparse index in a collection made on a server that has one (see `sparse_schema`).
SPARSE_KEY = "rag_bm25"
# What Chroma answers when a server cannot hold a sparse index (`chroma run`, embedded Chroma in chromadb 1.5).
SPARSE_REFUSED = "Sparse vector indexing is not enabled"


def server_record(chunk: _ChunkIds, paper: Any, counts: dict[tuple[str, str], int]) -> dict[str, Any]:
    """A chunk's metadata on a server: its place in its abstract, and with the first chunk of an abstract the
    abstract itself, how many chunks it has, and its paper's fields (Chroma keeps no None values)."""
    meta: dict[str, Any] = {"paper_id": chunk.paper_id, "abstract_hash": chunk.abstract_hash, "seq": chunk.seq}
    if chunk.seq == 0:
        meta["abstract"] = chunk.abstract
        meta["n_chunks"] = counts[(chunk.paper_id, chunk.abstract_hash)]
        if paper is not None:
            meta.update({"title": paper.title, "label": paper.label, "authors": json.dumps(paper.authors)})
            meta.update({k: v for k, v in (("url", paper.url), ("venue", paper.venue), ("year", paper.year)) if v})
    return meta


def sparse_schema():
    """A collection layout with cosine vectors and Chroma's BM25 sparse index over the chunk text: the client
    computes each document's term weights on upsert (`ChromaBm25EmbeddingFunction`, needs snowballstemmer) and
    the server weighs terms by their document frequency (`bm25=True`). Only Chroma's distributed deployment
    (and Chroma Cloud) accepts it; `chroma run` refuses it with `SPARSE_REFUSED`."""
    from chromadb import K, Schema, SparseVectorIndexConfig, VectorIndexConfig
    from chromadb.utils.embedding_functions import ChromaBm25EmbeddingFunction

    schema = Schema()
    schema.create_index(config=VectorIndexConfig(space="cosine"))
    schema.create_index(key=SPARSE_KEY, config=SparseVectorIndexConfig(
        source_key=K.DOCUMENT, embedding_function=ChromaBm25EmbeddingFunction(), bm25=True))
    return schema


def has_sparse_index(collection: Any) -> bool:
    """Whether a collection's schema holds an enabled sparse index under `SPARSE_KEY` (feature detection: a
    collection made by `chroma run`, or before this existed, has none)."""
    keys = getattr(getattr(collection, "schema", None), "keys", None) or {}
    value_types = keys.get(SPARSE_KEY)
    sparse = getattr(value_types, "sparse_vector", None)
    index = getattr(sparse, "sparse_vector_index", None)
    return bool(index is not None and index.enabled)


def derived_collection_name(store_dir: Path) -> str:
    """A collection name of this store's own on a server: the directory's name and 8 hex digits of the host
    and the absolute path (two stores on one server never meet by accident; a replica that should share a
    corpus is given its name with RAG_COLLECTION)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", store_dir.name).strip("-")[:40] or "store"
    where = f"{socket.gethostname()}:{Path(store_dir).expanduser().resolve()}"
    return f"{DEFAULT_COLLECTION}-{slug}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"


def replica_id(store_dir: Path) -> tuple[str, str]:
    """This store's key in a collection's metadata, and what it says (host:path)."""
    where = f"{socket.gethostname()}:{Path(store_dir).expanduser().resolve()}"
    return REPLICA_KEY + hashlib.sha1(where.encode()).hexdigest()[:12], where


class _ChunkIds(Protocol):
    """What a vector is stored under, and with on a server (a `rag.index.store.Chunk`)."""

    @property
    def chunk_id(self) -> str: ...
    @property
    def paper_id(self) -> str: ...
    @property
    def abstract_hash(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def abstract(self) -> str: ...


class CollectionShared(InputError):
    """A `--rebuild` would delete a collection other stores write into (the CLI asks at a terminal)."""


class VectorsUnwritable(StoreError):
    """Embedded Chroma cannot open the vectors without writing (full disk, read-only store)."""


class VectorsDamaged(VectorsUnwritable):
    """Embedded Chroma's files cannot be read (truncated, garbled). Handled like an unwritable store:
    questions fall back to keyword retrieval with one warning; `rag repair` re-indexes the vectors."""


def repair_command(store_dir: Path) -> str:
    return f"rag repair --store {store_dir}"


def damaged_vectors(store_dir: Path, exc: Exception) -> VectorsDamaged:
    return VectorsDamaged(f"the vectors in {store_dir / 'chroma'} cannot be read ({short_error(exc)}); run "
                          f"`{repair_command(store_dir)}` to re-index them from papers.sqlite (it keeps every paper)")


class ChromaVectors:
    """The Chroma half of `Store`: methods only; the state is set by `Store.__init__` (declared below)."""

    settings: Settings
    dir: Path
    _client: Any
    _collection: Any
    _chroma_lock: threading.Lock
    _warming: threading.Thread | None
    _unwritable: VectorsUnwritable | None
    vectors_unavailable: str | None
    sparse_unavailable: str | None

    if TYPE_CHECKING:  # the manifest's half, in Store
        @property
        def collection_name(self) -> str: ...
        def last_rowid(self) -> int: ...
        def chunk_count(self) -> int: ...
        def exists(self) -> bool: ...
        def set_meta(self, key: str, value: str | None) -> None: ...
        def sample_chunk_ids(self, n: int) -> list[str]: ...
        def rowids_for_chunk_ids(self, chunk_ids: list[str]) -> dict[str, int]: ...

    def _write_vectors(self, chunks: Sequence[_ChunkIds], vectors: list[list[float]],
                       papers: Sequence[Any] = ()) -> None:
        """Upsert the chunks' vectors in batches Chroma accepts (the Chroma half of `Store.add`). On a server
        each chunk also carries its text and its paper's metadata (`server_record`): the server is the
        corpus, and other stores build their caches from it (rag/index/replica.py)."""
        collection = self.collection()
        by_id = {p.paper_id: p for p in papers}
        counts: dict[tuple[str, str], int] = {}
        for c in chunks:
            counts[(c.paper_id, c.abstract_hash)] = counts.get((c.paper_id, c.abstract_hash), 0) + 1
        for start in range(0, len(chunks), CHROMA_MAX_BATCH):
            part = chunks[start:start + CHROMA_MAX_BATCH]
            extra: dict[str, Any] = {}
            if self.settings.chroma_url and by_id:
                extra = {"documents": [c.text for c in part],
                         "metadatas": [server_record(c, by_id.get(c.paper_id), counts) for c in part]}
            try:
                collection.upsert(
                    ids=[c.chunk_id for c in part],
                    embeddings=vectors[start:start + CHROMA_MAX_BATCH],
                    **({"metadatas": [{"paper_id": c.paper_id} for c in part]} | extra),
                )
            except Exception as exc:  # chromadb raises its own types (disk full, server gone...)
                raise StoreError(
                    f"could not write vectors to Chroma ({short_error(exc)}); free disk space or check "
                    "RAG_CHROMA_URL, then run the ingest again (it resumes)"
                ) from None

    def _drop_vectors(self) -> None:
        """Delete this store's collection (the Chroma half of `Store.clear`)."""
        # Delete through the client: Chroma caches one client per path, so removing its files
        # under a live client leaves that client writing to a deleted (read-only) database.
        try:
            client = self._chroma_client()
        except VectorsDamaged:
            # Embedded Chroma's files cannot be opened: nothing in them can be deleted through it.
            client = None
            self._unwritable = None
            forget_chroma_clients()
            shutil.rmtree(self.dir / "chroma", ignore_errors=True)
        if client is not None:
            with contextlib.suppress(Exception):  # absent collection: nothing to delete
                client.delete_collection(self.collection_name)
        self._collection = None

    # ---- sharing a server ------------------------------------------------------------------

    def register_replica(self, embedding_model: str) -> None:
        """After an ingest on a server: name this store in its collection's metadata (host:path), so that a
        `--rebuild` by another store can tell it is not alone, with the embedding model of the corpus (the
        first ingest's), and record in the manifest which collection its caches were built from.
        Read-modify-write: two first ingests at the same instant may leave one name out; the count check of
        `check_rebuild_alone` still sees its vectors."""
        if not self.settings.chroma_url:
            return
        collection = self.collection()
        key, where = replica_id(self.dir)
        metadata = dict(collection.metadata or {})
        if metadata.get(key) != where or "rag_embedding_model" not in metadata:
            metadata[key] = where
            metadata.setdefault("rag_embedding_model", embedding_model)
            try:
                collection.modify(metadata=metadata)
            except Exception as exc:
                raise StoreError(f"could not update Chroma collection {self.collection_name!r} ({short_error(exc)}); "
                                 "check RAG_CHROMA_URL") from None
        if self.exists():
            self.set_meta("server_collection", str(collection.id))

    def server_state(self) -> tuple[str, int] | None:
        """The collection's id and number of chunks on the server (None when it does not exist): one request
        with an open handle. A collection deleted under the handle is looked up again."""
        for _ in (0, 1):  # a handle to a deleted collection, then a fresh lookup
            with self._chroma_lock:
                collection = self._collection
            try:
                if collection is None:
                    collection = self._chroma_client().get_collection(self.collection_name)
                    with self._chroma_lock:
                        self._collection = collection
                return str(collection.id), int(collection.count())
            except StoreError:
                raise
            except Exception as exc:
                with self._chroma_lock:
                    self._collection = None
                if not no_such_collection(exc):
                    raise StoreError(f"could not query Chroma at {redact_url(self.settings.chroma_url or '')} "
                                     f"({short_error(exc)}); check RAG_CHROMA_URL") from None
        return None

    def check_rebuild_alone(self) -> None:
        """Refuse a `--rebuild` that would delete other stores' vectors: on a server, a collection that names
        other stores, or holds more vectors than this store has chunks, is shared."""
        if not self.settings.chroma_url:
            return  # embedded Chroma: one collection per store directory
        try:
            collection = self._chroma_client().get_collection(self.collection_name)
        except StoreError:
            raise
        except Exception:
            return  # no such collection: nothing to lose
        key, _ = replica_id(self.dir)
        others = sorted(v for k, v in (collection.metadata or {}).items() if k.startswith(REPLICA_KEY) and k != key)
        extra = collection.count() - (self.chunk_count() if self.exists() else 0)
        if not others and extra <= 0:
            return
        whose = (f"{len(others)} other store{'s' if len(others) > 1 else ''} write{'' if len(others) > 1 else 's'} "
                 f"into it ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" if others else
                 f"it holds {extra:,} vectors that are not this store's")
        raise CollectionShared(f"Chroma collection {self.collection_name!r} is shared: {whose}, and --rebuild would delete "
                         "them too; give this store a collection of its own (--collection NAME), or pass --yes to "
                         "rebuild the shared one")

    def vectors_gone(self) -> bool:
        """Whether none of a sample of this store's chunks has its vector in the collection (another store
        rebuilt or replaced a shared collection)."""
        sample = self.sample_chunk_ids(20)
        if not sample:
            return False
        try:
            got = self.collection().get(ids=sample, include=[])
        except Exception:
            return False  # the query that follows reports what is wrong
        return not got["ids"]

    def vectors_gone_message(self) -> str:
        return (f"the Chroma collection {self.collection_name!r} holds none of this store's {self.chunk_count():,} "
                "chunks (another store rebuilt or replaced it); ingest this store's papers again, or set "
                "RAG_COLLECTION to the collection that holds them")

    def _chroma_client(self):
        if self._unwritable is not None:
            # Chroma caches a half-opened client per path: a second attempt fails with a confusing
            # error ("'RustBindingsAPI' object has no attribute 'bindings'"), so the first one's stands.
            raise self._unwritable
        if self._client is None:
            import chromadb
            from chromadb.config import Settings as ChromaSettings

            chroma_settings = ChromaSettings(anonymized_telemetry=False)
            url = self.settings.chroma_url
            try:
                if url:
                    parsed = urlparse(url if "://" in url else f"http://{url}")
                    self._client = chromadb.HttpClient(
                        host=parsed.hostname or "127.0.0.1", port=parsed.port or 8000,
                        ssl=parsed.scheme == "https", settings=chroma_settings,
                    )
                else:
                    self._client = chromadb.PersistentClient(path=str(self.dir / "chroma"), settings=chroma_settings)
            except Exception as exc:  # chromadb raises several types for an unreachable server
                where = redact_url(url) if url else str(self.dir / "chroma")
                if not url and not os.access(self.dir, os.W_OK):
                    self._unwritable = VectorsUnwritable(
                        f"the store at {self.dir} is read-only and embedded Chroma must write to open it; copy it "
                        "to a writable place and point --store there")
                    raise self._unwritable from None
                if not url and _disk_full(exc):
                    self._unwritable = VectorsUnwritable(f"the disk holding {self.dir} is full and embedded Chroma "
                                                         "must write to open it; free disk space")
                    raise self._unwritable from None
                if not url:  # a writable store with room: its files are damaged (truncated, garbled)
                    self._unwritable = damaged_vectors(self.dir, exc)
                    raise self._unwritable from None
                raise StoreError(f"cannot reach Chroma at {where} ({short_error(exc)}); check RAG_CHROMA_URL, "
                                 "free disk space, or check the store directory") from None
        return self._client

    def collection(self):
        with self._chroma_lock:
            if self._collection is None:
                client = self._chroma_client()
                try:
                    self._collection = (self._open_server_collection(client) if self.settings.chroma_url else
                                        client.get_or_create_collection(
                                            self.collection_name, embedding_function=None,
                                            configuration={"hnsw": {"space": "cosine"}}))
                except Exception as exc:
                    if not self.settings.chroma_url:
                        raise damaged_vectors(self.dir, exc) from None
                    raise StoreError(f"cannot open Chroma collection {self.collection_name!r} ({short_error(exc)}); check RAG_COLLECTION and RAG_CHROMA_URL") from None
            return self._collection

    def _open_server_collection(self, client):
        """The collection on a server; a new one is made with Chroma's BM25 sparse index where the server
        accepts it (`sparse_schema`), and without it where it does not (`chroma run`): keyword search then
        uses the local BM25 cache."""
        try:
            return client.get_collection(self.collection_name, embedding_function=None)
        except Exception as exc:
            if not no_such_collection(exc):
                raise
        try:
            schema = sparse_schema()
        except (ImportError, ValueError):  # snowballstemmer missing: the term weights cannot be computed here
            schema = None
        if schema is not None:
            try:
                return client.create_collection(self.collection_name, embedding_function=None, schema=schema,
                                                get_or_create=True)
            except Exception as exc:
                if SPARSE_REFUSED not in str(exc):
                    raise
        return client.get_or_create_collection(self.collection_name, embedding_function=None,
                                               configuration={"hnsw": {"space": "cosine"}})

    def server_keyword_search(self) -> bool:
        """Whether keyword retrieval runs on the server (its collection has a sparse index and no query has
        failed on it), rather than on the local BM25 cache."""
        if not self.settings.chroma_url or self.sparse_unavailable:
            return False
        try:
            return has_sparse_index(self.collection())
        except Exception:
            return False

    def sparse_search(self, query: str, n: int) -> list[tuple[int, float]] | None:
        """The best `n` committed chunks by the server's BM25 (rowid, score), best first, in one `Search`
        request; None when the server cannot run it, with the reason kept in `sparse_unavailable` (keyword
        search then uses the local cache, for this store's life)."""
        from chromadb import K, Knn, Search

        try:
            res = self.collection().search(
                Search().rank(Knn(query=query, key=SPARSE_KEY, limit=n)).limit(n).select(K.SCORE))
            ids, scores = res["ids"][0], res["scores"][0] or [0.0] * len(res["ids"][0])
        except Exception as exc:  # chromadb raises its own types
            self.sparse_unavailable = short_error(exc)
            return None
        rowids = self.rowids_for_chunk_ids(list(ids))
        # Chroma ranks ascending (a BM25 match scores as its negative); the order is the server's.
        return [(rowids[i], abs(float(s))) for i, s in zip(ids, scores) if i in rowids]

    def warm_vectors(self) -> None:
        """Open Chroma and load its nearest-neighbour index on a background thread, once: a first
        question then pays that (~1 s at 100k abstracts: importing chromadb, reading the HNSW
        index) while its own embedding model loads, not after. Errors are left to the query."""
        if self._collection is not None or self._warming is not None:
            return

        def warm() -> None:
            with contextlib.suppress(Exception):
                collection = self.collection()
                got = collection.get(limit=1, include=["embeddings"])
                if len(got["ids"]):
                    collection.query(query_embeddings=[got["embeddings"][0]], n_results=1, include=["distances"])

        # Not a daemon: a process ending while Chroma's native code runs on a daemon thread crashes
        # (SIGSEGV at exit, seen in `rag search`); the interpreter waits for this one instead.
        self._warming = threading.Thread(target=warm, name="rag-warm-vectors", daemon=False)
        self._warming.start()

    def dense_search(self, vector: list[float], n: int) -> list[tuple[int, float]] | None:
        """The best `n` committed chunks by cosine similarity: (rowid, similarity), best first; None when
        the vectors cannot be read here (embedded Chroma on a full disk or a read-only store: it
        must write to open), with the reason in `vectors_unavailable`."""
        if self._warming is not None:
            self._warming.join()  # it is loading the index this query needs
        try:
            collection = self.collection()
        except VectorsUnwritable as exc:
            # Queries must not need to write: keyword retrieval still answers; callers say so.
            self.vectors_unavailable = str(exc)
            return None
        # No count() first: Chroma returns what it has when asked for more, and counting costs a scan.
        try:
            try:
                res = collection.query(query_embeddings=[vector], n_results=n, include=["distances"])
            except Exception as exc:
                if not self.settings.chroma_url or not no_such_collection(exc):
                    raise
                # Deleted on the server under this open handle (another store's --rebuild): open it again.
                with self._chroma_lock:
                    self._collection = None
                collection = self.collection()
                res = collection.query(query_embeddings=[vector], n_results=n, include=["distances"])
        except Exception as exc:
            if self.settings.chroma_url:
                raise StoreError(f"could not query Chroma at {redact_url(self.settings.chroma_url)} ({short_error(exc)}); "
                                 "check RAG_CHROMA_URL") from None
            self.vectors_unavailable = str(damaged_vectors(self.dir, exc))  # damaged files: keywords still answer
            return None
        ids, dists = res["ids"][0], res["distances"][0]
        if not ids and self.last_rowid() >= 0:
            # Chunks are committed but Chroma holds no vector (its directory deleted, or a new server).
            fix = ("ingest the papers into the server again" if self.settings.chroma_url else
                   f"run `rag repair --store {self.dir}` to re-index them from papers.sqlite")
            self.vectors_unavailable = (f"the vector store of {self.dir} holds no vectors for its "
                                        f"{self.chunk_count():,} chunks; {fix}")
            return None
        rowids = self.rowids_for_chunk_ids(ids)
        if ids and not rowids and self.settings.chroma_url and self.vectors_gone():
            self.vectors_unavailable = self.vectors_gone_message()
            return None
        # Orphan vectors of a killed ingest have no committed row: they are skipped.
        return [(rowids[i], 1.0 - float(d)) for i, d in zip(ids, dists) if i in rowids]

    def vectors(self, chunk_ids: list[str]):
        """The chunks' vectors as a float32 matrix, one row per id in order (read in batches)."""
        import numpy as np

        collection = self.collection()
        out = None
        for start in range(0, len(chunk_ids), CHROMA_MAX_BATCH):
            part = chunk_ids[start:start + CHROMA_MAX_BATCH]
            try:
                got = collection.get(ids=part, include=["embeddings"])
            except Exception as exc:  # chromadb raises its own types (server gone, damaged files...)
                if not self.settings.chroma_url:
                    raise damaged_vectors(self.dir, exc) from None
                raise StoreError(f"could not read vectors from Chroma ({short_error(exc)}); check RAG_CHROMA_URL "
                                 "and the store directory") from None
            if out is None:
                out = np.zeros((len(chunk_ids), len(got["embeddings"][0]) if len(got["ids"]) else 0), np.float32)
            where = {cid: i for i, cid in enumerate(part)}
            missing = set(part) - set(got["ids"])
            if missing:
                raise StoreError(f"{len(missing)} indexed chunks have no vector in Chroma (e.g. {min(missing)}); "
                                 f"re-index them with `rag repair --store {self.dir}` (it keeps every paper)")
            out[[start + where[cid] for cid in got["ids"]]] = np.asarray(got["embeddings"], dtype=np.float32)
        return np.zeros((0, 0), np.float32) if out is None else out

    def similarities(self, vector: list[float], chunk_ids: list[str]) -> dict[str, float]:
        """Cosine similarity of the vector to each of these chunks' vectors (those that can be read)."""
        import numpy as np

        if not chunk_ids or self.vectors_unavailable:
            return {}
        try:
            got = self.collection().get(ids=chunk_ids, include=["embeddings"])
        except VectorsUnwritable as exc:
            self.vectors_unavailable = str(exc)
            return {}
        except Exception as exc:
            if self.settings.chroma_url:
                raise
            self.vectors_unavailable = str(damaged_vectors(self.dir, exc))
            return {}
        if not got["ids"]:
            return {}
        q = np.asarray(vector, dtype=np.float32)
        m = np.asarray(got["embeddings"], dtype=np.float32)
        sims = m @ q / np.maximum(np.linalg.norm(m, axis=1) * np.linalg.norm(q), 1e-12)
        return dict(zip(got["ids"], sims.tolist()))


def chroma_paper_ids(store_dir: Path, collection: str) -> tuple[set[str], bool]:
    """Paper ids the embedded Chroma under `store_dir` names in `collection`'s metadata (ids only: Chroma holds
    no text), and whether it could be read at all; for `rag repair`, which cannot open a damaged store's `Store`."""
    ids: set[str] = set()
    if not (store_dir / "chroma").is_dir():
        return ids, False
    readable = False
    with contextlib.suppress(Exception):  # damaged or absent: the manifest's ids are all we have
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        client = chromadb.PersistentClient(path=str(store_dir / "chroma"),
                                           settings=ChromaSettings(anonymized_telemetry=False))
        col = client.get_collection(collection)
        offset = 0
        while True:
            got = col.get(include=["metadatas"], limit=5000, offset=offset)
            if not got["ids"]:
                break
            for meta in got["metadatas"] or []:
                pid = meta.get("paper_id") if meta else None
                if isinstance(pid, str):
                    ids.add(pid)
            offset += len(got["ids"])
        readable = True
    forget_chroma_clients()
    return ids, readable


def forget_chroma_clients() -> None:
    """Drop chromadb's per-path client cache: a client half-opened on damaged files would be handed out
    again for the same path after they are replaced."""
    with contextlib.suppress(Exception):
        from chromadb.api.shared_system_client import SharedSystemClient

        SharedSystemClient.clear_system_cache()


def no_such_collection(exc: Exception) -> bool:
    """Chroma's error for a collection that is not there (never made, or deleted under an open handle by
    another store's --rebuild): chromadb raises several types for it, all saying so."""
    return "does not exist" in str(exc)


def _disk_full(exc: Exception) -> bool:
    text = str(exc).lower()
    return "disk is full" in text or "no space left" in text or "disk i/o error" in text


def short_error(exc: Exception) -> str:
    """An exception as one short line (Chroma's messages can be long and multi-line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
