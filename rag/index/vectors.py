"""The vectors of a store, behind one small interface (`Vectors`, like paper-qa's `VectorStore`):
embedded Chroma under `store/chroma/` (`EmbeddedChroma`) or a collection on a Chroma server
(`ChromaServer`, `RAG_CHROMA_URL`); `rag.index.memory_vectors.MemoryVectors` holds them in memory
for tests. `Store` owns one and delegates to it. This is the only module that imports chromadb.

Failures that leave keyword retrieval working (a full disk, a read-only store, damaged files) raise
`VectorsUnwritable`; `rag repair` re-indexes damaged vectors from papers.sqlite."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from rag.config import redact_url
from rag.errors import InputError, StoreError

if TYPE_CHECKING:
    import numpy as np

CHROMA_MAX_BATCH = 5000  # Chroma accepts at most 5,461 records per write
DEFAULT_COLLECTION = "papers"
# Collection metadata keys naming the stores that write into a server's collection (`register`).
REPLICA_KEY = "rag_replica_"
# The key of Chroma's BM25 sparse index in a server's collection that has one (`sparse_schema`).
SPARSE_KEY = "rag_bm25"
# What Chroma answers when it cannot hold a sparse index (`chroma run`, embedded in chromadb 1.5).
SPARSE_REFUSED = "Sparse vector indexing is not enabled"


class ChunkIds(Protocol):
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
    """A `--rebuild` would delete a collection other stores write into (the CLI then asks)."""


class VectorsUnwritable(StoreError):
    """Embedded Chroma cannot open the vectors without writing (full disk, read-only store)."""


class VectorsDamaged(VectorsUnwritable):
    """Embedded Chroma's files cannot be read (truncated, garbled). Handled like an unwritable
    store: questions fall back to keyword retrieval with one warning; `rag repair` re-indexes the
    vectors."""


class Vectors(ABC):
    """A store's chunk vectors, by chunk id. Similarities are cosine; search is best first. Methods
    raise `VectorsUnwritable` when the vectors cannot be read here (keywords still answer),
    `StoreError` else."""

    @abstractmethod
    def write(
        self, chunks: Sequence[ChunkIds], vectors: list[list[float]], papers: Sequence[Any] = ()
    ) -> None:
        """Upsert the chunks' vectors (`papers`: their papers, for backends that keep metadata)."""

    @abstractmethod
    def drop(self) -> None:
        """Delete every vector (for `--rebuild`)."""

    @abstractmethod
    def count(self) -> int:
        """How many vectors are held (orphans of a killed ingest included)."""

    @abstractmethod
    def search(self, vector: list[float], n: int) -> list[tuple[str, float]]:
        """The `n` nearest chunks: (chunk id, cosine similarity), best first."""

    @abstractmethod
    def fetch(self, chunk_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """The vectors of those of these chunks that have one: their ids, and a float32 matrix."""

    # Optional hooks, deliberately not abstract: vectors with no client or files need none of them.
    def open(self) -> None:  # noqa: B027
        """Open now what the first use would open (an ingest does it while its model loads)."""

    def warm(self) -> None:  # noqa: B027
        """Start loading what a first search needs, in the background."""

    def close(self) -> None:  # noqa: B027
        """Let go of open files and clients (they open again on use); the vectors stay."""


def server_record(
    chunk: ChunkIds, paper: Any, counts: dict[tuple[str, str], int]
) -> dict[str, Any]:
    """A chunk's metadata on a server: its place in its abstract, and with the first chunk of an
    abstract the abstract itself, how many chunks it has, and its paper's fields (Chroma keeps no
    None values)."""
    meta: dict[str, Any] = {
        "paper_id": chunk.paper_id,
        "abstract_hash": chunk.abstract_hash,
        "seq": chunk.seq,
    }
    if chunk.seq == 0:
        meta["abstract"] = chunk.abstract
        meta["n_chunks"] = counts[(chunk.paper_id, chunk.abstract_hash)]
        if paper is not None:
            meta.update(
                {"title": paper.title, "label": paper.label, "authors": json.dumps(paper.authors)}
            )
            fields = (("url", paper.url), ("venue", paper.venue), ("year", paper.year))
            meta.update({k: v for k, v in fields if v})
    return meta


def sparse_schema():
    """A collection layout with cosine vectors and Chroma's BM25 sparse index over the chunk text:
    the client computes each document's term weights on upsert (`ChromaBm25EmbeddingFunction`, needs
    snowballstemmer) and the server weighs terms by their document frequency (`bm25=True`). Only
    Chroma's distributed deployment (and Chroma Cloud) accepts it; `chroma run` refuses it with
    `SPARSE_REFUSED`."""
    from chromadb import K, Schema, SparseVectorIndexConfig, VectorIndexConfig
    from chromadb.utils.embedding_functions import ChromaBm25EmbeddingFunction

    schema = Schema()
    schema.create_index(config=VectorIndexConfig(space="cosine"))
    schema.create_index(
        key=SPARSE_KEY,
        config=SparseVectorIndexConfig(
            source_key=K.DOCUMENT, embedding_function=ChromaBm25EmbeddingFunction(), bm25=True
        ),
    )
    return schema


def has_sparse_index(collection: Any) -> bool:
    """Whether a collection's schema holds an enabled sparse index under `SPARSE_KEY` (feature
    detection: a collection made by `chroma run`, or before this existed, has none)."""
    keys = getattr(getattr(collection, "schema", None), "keys", None) or {}
    value_types = keys.get(SPARSE_KEY)
    sparse = getattr(value_types, "sparse_vector", None)
    index = getattr(sparse, "sparse_vector_index", None)
    return bool(index is not None and index.enabled)


def derived_collection_name(store_dir: Path) -> str:
    """A collection name of this store's own on a server: the directory's name and 8 hex digits of
    the host and the absolute path (two stores on one server never meet by accident; a replica that
    should share a corpus is given its name with RAG_COLLECTION)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", store_dir.name).strip("-")[:40] or "store"
    where = f"{socket.gethostname()}:{Path(store_dir).expanduser().resolve()}"
    return f"{DEFAULT_COLLECTION}-{slug}-{hashlib.sha1(where.encode()).hexdigest()[:8]}"


def replica_id(store_dir: Path) -> tuple[str, str]:
    """This store's key in a collection's metadata, and what it says (host:path)."""
    where = f"{socket.gethostname()}:{Path(store_dir).expanduser().resolve()}"
    return REPLICA_KEY + hashlib.sha1(where.encode()).hexdigest()[:12], where


def repair_command(store_dir: Path) -> str:
    return f"rag repair --store {store_dir}"


def damaged_vectors(store_dir: Path, exc: Exception) -> VectorsDamaged:
    return VectorsDamaged(
        f"the vectors in {store_dir / 'chroma'} cannot be read "
        f"({short_error(exc)}); run `{repair_command(store_dir)}` to re-index "
        "them from papers.sqlite (it keeps every paper)"
    )


def chroma_vectors(
    store_dir: Path, url: str | None, collection_name: Callable[[], str]
) -> ChromaVectors:
    """The Chroma vectors of a store: on the server at `url`, else embedded under
    `store_dir/chroma`. `collection_name` is asked when the collection is opened (the store reads it
    from its manifest)."""
    if url:
        return ChromaServer(url, store_dir, collection_name)
    return EmbeddedChroma(store_dir, collection_name)


class ChromaVectors(Vectors):
    """What embedded Chroma and a Chroma server share: one client and one collection, opened on
    first use and kept (thread-safe), batched writes and reads, cosine search."""

    def __init__(self, store_dir: Path, collection_name: Callable[[], str]) -> None:
        self.dir = store_dir
        self._name = collection_name
        self._client: Any = None
        self._collection: Any = None
        self._lock = threading.Lock()
        self._warming: threading.Thread | None = None  # see warm

    @property
    def name(self) -> str:
        """The collection's name."""
        return self._name()

    # ---- what differs between embedded Chroma and a server ----------------------------------

    @abstractmethod
    def _new_client(self) -> Any:
        """A chromadb client, or the error to raise for why there is none."""

    @abstractmethod
    def _open_collection(self, client: Any) -> Any: ...

    @abstractmethod
    def _open_failed(self, exc: Exception) -> StoreError:
        """The error for a collection that cannot be opened."""

    @abstractmethod
    def _read_failed(self, exc: Exception, what: str) -> StoreError:
        """The error for a query or read that failed (`what`: "query", "read vectors from")."""

    def _metadatas(
        self, chunks: Sequence[ChunkIds], by_id: dict[str, Any], counts: dict[tuple[str, str], int]
    ) -> dict[str, Any]:
        """What is written beside each vector: its paper id."""
        return {"metadatas": [{"paper_id": c.paper_id} for c in chunks]}

    def _query(self, collection: Any, vector: list[float], n: int) -> Any:
        return collection.query(query_embeddings=[vector], n_results=n, include=["distances"])

    # ---- the interface ----------------------------------------------------------------------

    def client(self) -> Any:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def collection(self) -> Any:
        """The Chroma collection, opened on first use."""
        with self._lock:
            if self._collection is None:
                client = self.client()
                try:
                    self._collection = self._open_collection(client)
                except Exception as exc:
                    raise self._open_failed(exc) from None
            return self._collection

    def open(self) -> None:
        self.collection()

    def close(self) -> None:
        with self._lock:
            self._collection, self._client = None, None

    def write(
        self, chunks: Sequence[ChunkIds], vectors: list[list[float]], papers: Sequence[Any] = ()
    ) -> None:
        """Upsert in batches Chroma accepts."""
        collection = self.collection()
        by_id = {p.paper_id: p for p in papers}
        counts: dict[tuple[str, str], int] = {}
        for c in chunks:
            counts[(c.paper_id, c.abstract_hash)] = counts.get((c.paper_id, c.abstract_hash), 0) + 1
        for start in range(0, len(chunks), CHROMA_MAX_BATCH):
            part = chunks[start : start + CHROMA_MAX_BATCH]
            try:
                collection.upsert(
                    ids=[c.chunk_id for c in part],
                    embeddings=vectors[start : start + CHROMA_MAX_BATCH],
                    **self._metadatas(part, by_id, counts),
                )
            except Exception as exc:  # chromadb raises its own types (disk full, server gone...)
                raise StoreError(
                    f"could not write vectors to Chroma ({short_error(exc)}); free disk space or "
                    "check RAG_CHROMA_URL, then run the ingest again (it resumes)"
                ) from None

    def drop(self) -> None:
        """Delete the collection through the client: Chroma caches one client per path, so removing
        its files under a live client leaves that client writing to a deleted (read-only) database.
        """
        client = self.client()
        with contextlib.suppress(Exception):  # absent collection: nothing to delete
            client.delete_collection(self.name)
        self._collection = None

    def count(self) -> int:
        return int(self.collection().count())

    def warm(self) -> None:
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
                    collection.query(
                        query_embeddings=[got["embeddings"][0]], n_results=1, include=["distances"]
                    )

        # Not a daemon: a process ending while Chroma's native code runs on a daemon thread crashes
        # (SIGSEGV at exit, seen in `rag search`); the interpreter waits for this one instead.
        self._warming = threading.Thread(target=warm, name="rag-warm-vectors", daemon=False)
        self._warming.start()

    def search(self, vector: list[float], n: int) -> list[tuple[str, float]]:
        if self._warming is not None:
            self._warming.join()  # it is loading the index this query needs
        collection = self.collection()
        # No count() first: Chroma returns what it has when asked for more, and counting costs a
        # scan.
        try:
            res = self._query(collection, vector, n)
        except Exception as exc:
            raise self._read_failed(exc, "query") from None
        return [(i, 1.0 - float(d)) for i, d in zip(res["ids"][0], res["distances"][0])]

    def fetch(self, chunk_ids: list[str]) -> tuple[list[str], np.ndarray]:
        """Read in batches Chroma accepts."""
        import numpy as np

        collection = self.collection()
        ids: list[str] = []
        parts = []
        for start in range(0, len(chunk_ids), CHROMA_MAX_BATCH):
            try:
                got = collection.get(
                    ids=chunk_ids[start : start + CHROMA_MAX_BATCH], include=["embeddings"]
                )
            except Exception as exc:  # chromadb's own types (server gone, damaged files...)
                raise self._read_failed(exc, "read vectors from") from None
            if len(got["ids"]):
                ids.extend(got["ids"])
                parts.append(np.asarray(got["embeddings"], dtype=np.float32))
        return ids, np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


class EmbeddedChroma(ChromaVectors):
    """Embedded Chroma under `store/chroma/`: one collection per store directory. It must write to
    open, so a full disk or a read-only store leaves it unreadable (`VectorsUnwritable`), as do
    damaged files (`VectorsDamaged`); questions then use keywords alone."""

    def __init__(self, store_dir: Path, collection_name: Callable[[], str]) -> None:
        super().__init__(store_dir, collection_name)
        self._unwritable: VectorsUnwritable | None = None  # why it could not open, once it failed

    def client(self) -> Any:
        if self._unwritable is not None:
            # Chroma caches a half-opened client per path: a second attempt fails with a confusing
            # error ("'RustBindingsAPI' object has no attribute 'bindings'"), so the first one's
            # stands.
            raise self._unwritable
        return super().client()

    def _new_client(self) -> Any:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        try:
            return chromadb.PersistentClient(
                path=str(self.dir / "chroma"), settings=ChromaSettings(anonymized_telemetry=False)
            )
        except Exception as exc:
            if not os.access(self.dir, os.W_OK):
                self._unwritable = VectorsUnwritable(
                    f"the store at {self.dir} is read-only and embedded Chroma must write to open "
                    "it; copy it to a writable place and point --store there"
                )
            elif _disk_full(exc):
                self._unwritable = VectorsUnwritable(
                    f"the disk holding {self.dir} is full and embedded Chroma must write to open "
                    "it; free disk space"
                )
            else:  # a writable store with room: its files are damaged (truncated, garbled)
                self._unwritable = damaged_vectors(self.dir, exc)
            raise self._unwritable from None

    def _open_collection(self, client: Any) -> Any:
        return client.get_or_create_collection(
            self.name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
        )

    def _open_failed(self, exc: Exception) -> StoreError:
        return damaged_vectors(self.dir, exc)

    def _read_failed(self, exc: Exception, what: str) -> StoreError:
        return damaged_vectors(self.dir, exc)  # damaged files: keywords still answer

    def drop(self) -> None:
        try:
            self.client()
        except VectorsDamaged:
            # Its files cannot be opened: nothing in them can be deleted through it.
            self._unwritable = None
            forget_chroma_clients()
            shutil.rmtree(self.dir / "chroma", ignore_errors=True)
            self._collection = None
            return
        super().drop()


class ChromaServer(ChromaVectors):
    """A collection on a Chroma server (`RAG_CHROMA_URL`). The server is the corpus: each chunk also
    carries its text and its paper's metadata (`server_record`), so stores sharing the collection
    build their caches from it (rag/index/replica.py). Beyond `Vectors`: replica bookkeeping, the
    collection's state, and Chroma's BM25 sparse search where the server has that index."""

    def __init__(self, url: str, store_dir: Path, collection_name: Callable[[], str]) -> None:
        super().__init__(store_dir, collection_name)
        self.url = url
        self.sparse_unavailable: str | None = None  # why the server's BM25 index failed, if it did

    def _new_client(self) -> Any:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        try:
            parsed = urlparse(self.url if "://" in self.url else f"http://{self.url}")
            return chromadb.HttpClient(
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or 8000,
                ssl=parsed.scheme == "https",
                settings=ChromaSettings(anonymized_telemetry=False),
            )
        except Exception as exc:  # chromadb raises several types for an unreachable server
            raise StoreError(
                f"cannot reach Chroma at {redact_url(self.url)} ({short_error(exc)}); "
                "check RAG_CHROMA_URL, free disk space, or check the store directory"
            ) from None

    def _open_collection(self, client: Any) -> Any:
        """A new collection gets Chroma's BM25 sparse index where the server accepts it
        (`sparse_schema`), and none where it does not (`chroma run`): keyword search then uses the
        local BM25 cache."""
        try:
            return client.get_collection(self.name, embedding_function=None)
        except Exception as exc:
            if not no_such_collection(exc):
                raise
        try:
            schema = sparse_schema()
        except (ImportError, ValueError):  # no snowballstemmer: the term weights cannot be computed
            schema = None
        if schema is not None:
            try:
                return client.create_collection(
                    self.name, embedding_function=None, schema=schema, get_or_create=True
                )
            except Exception as exc:
                if SPARSE_REFUSED not in str(exc):
                    raise
        return client.get_or_create_collection(
            self.name, embedding_function=None, configuration={"hnsw": {"space": "cosine"}}
        )

    def _open_failed(self, exc: Exception) -> StoreError:
        return StoreError(
            f"cannot open Chroma collection {self.name!r} ({short_error(exc)}); "
            "check RAG_COLLECTION and RAG_CHROMA_URL"
        )

    def _read_failed(self, exc: Exception, what: str) -> StoreError:
        where = redact_url(self.url)
        return StoreError(
            f"could not {what} Chroma at {where} ({short_error(exc)}); check RAG_CHROMA_URL"
        )

    def _metadatas(
        self, chunks: Sequence[ChunkIds], by_id: dict[str, Any], counts: dict[tuple[str, str], int]
    ) -> dict[str, Any]:
        if not by_id:
            return super()._metadatas(chunks, by_id, counts)
        return {
            "documents": [c.text for c in chunks],
            "metadatas": [server_record(c, by_id.get(c.paper_id), counts) for c in chunks],
        }

    def _query(self, collection: Any, vector: list[float], n: int) -> Any:
        try:
            return super()._query(collection, vector, n)
        except Exception as exc:
            if not no_such_collection(exc):
                raise
        # Deleted on the server under this open handle (another store's --rebuild): open it again.
        with self._lock:
            self._collection = None
        return super()._query(self.collection(), vector, n)

    # ---- sharing a server -------------------------------------------------------------------

    def register(self, embedding_model: str) -> str:
        """Name this store in the collection's metadata (host:path), so that a `--rebuild` by
        another store can tell it is not alone, with the corpus's embedding model (the first
        ingest's); the collection's id. Read-modify-write: two first ingests at the same instant may
        leave one name out; the count check of `check_alone` still sees its vectors."""
        collection = self.collection()
        key, where = replica_id(self.dir)
        metadata = dict(collection.metadata or {})
        if metadata.get(key) != where or "rag_embedding_model" not in metadata:
            metadata[key] = where
            metadata.setdefault("rag_embedding_model", embedding_model)
            try:
                collection.modify(metadata=metadata)
            except Exception as exc:
                raise StoreError(
                    f"could not update Chroma collection {self.name!r} "
                    f"({short_error(exc)}); check RAG_CHROMA_URL"
                ) from None
        return str(collection.id)

    def state(self) -> tuple[str, int] | None:
        """The collection's id and number of chunks (None when it does not exist): one request with
        an open handle. A collection deleted under the handle is looked up again."""
        for _ in (0, 1):  # a handle to a deleted collection, then a fresh lookup
            with self._lock:
                collection = self._collection
            try:
                if collection is None:
                    collection = self.client().get_collection(self.name)
                    with self._lock:
                        self._collection = collection
                return str(collection.id), int(collection.count())
            except StoreError:
                raise
            except Exception as exc:
                with self._lock:
                    self._collection = None
                if not no_such_collection(exc):
                    raise self._read_failed(exc, "query") from None
        return None

    def check_alone(self, own_chunks: Callable[[], int]) -> None:
        """Refuse a `--rebuild` that would delete other stores' vectors: a collection that names
        other stores, or holds more vectors than this store has chunks (`own_chunks()`), is shared
        (`CollectionShared`)."""
        try:
            collection = self.client().get_collection(self.name)
        except StoreError:
            raise
        except Exception:
            return  # no such collection: nothing to lose
        key, _ = replica_id(self.dir)
        metadata = (collection.metadata or {}).items()
        others = sorted(v for k, v in metadata if k.startswith(REPLICA_KEY) and k != key)
        extra = collection.count() - own_chunks()
        if not others and extra <= 0:
            return
        many = len(others) > 1
        named = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        whose = (
            f"{len(others)} other store{'s' if many else ''} write{'' if many else 's'} "
            f"into it ({named})"
            if others
            else f"it holds {extra:,} vectors that are not this store's"
        )
        raise CollectionShared(
            f"Chroma collection {self.name!r} is shared: {whose}, and --rebuild "
            "would delete them too; give this store a collection of its own "
            "(--collection NAME), or pass --yes to rebuild the shared one"
        )

    def corpus_model(self) -> str | None:
        """The embedding model the collection's first ingest recorded."""
        return (self.collection().metadata or {}).get("rag_embedding_model")

    def all_ids(self, page: int = CHROMA_MAX_BATCH) -> set[str]:
        """Every chunk id in the collection, read `page` at a time."""
        collection = self.collection()
        ids: set[str] = set()
        offset = 0
        while True:
            got = collection.get(include=[], limit=page, offset=offset)
            if not got["ids"]:
                return ids
            ids.update(got["ids"])
            offset += len(got["ids"])

    def records(self, chunk_ids: list[str]) -> list[tuple[str, str | None, dict[str, Any]]]:
        """(chunk id, text, metadata) of these chunks (text None when written by a version that kept
        only vectors on the server), in one request."""
        got = self.collection().get(ids=chunk_ids, include=["documents", "metadatas"])
        n = len(got["ids"])
        return [
            (cid, text, dict(meta or {}))
            for cid, text, meta in zip(
                got["ids"], got["documents"] or [None] * n, got["metadatas"] or [None] * n
            )
        ]

    # ---- keyword search on the server -------------------------------------------------------

    def keyword_search_ready(self) -> bool:
        """Whether keyword retrieval runs here (the collection has a sparse index and no query has
        failed on it), rather than on the local BM25 cache."""
        if self.sparse_unavailable:
            return False
        try:
            return has_sparse_index(self.collection())
        except Exception:
            return False

    def sparse_search(self, query: str, n: int) -> list[tuple[str, float]] | None:
        """The best `n` chunks by the server's BM25 (chunk id, score), best first, in one `Search`
        request; None when the server cannot run it, with the reason kept in `sparse_unavailable`
        (keyword search then uses the local cache, for this store's life)."""
        from chromadb import K, Knn, Search

        try:
            res = self.collection().search(
                Search().rank(Knn(query=query, key=SPARSE_KEY, limit=n)).limit(n).select(K.SCORE)
            )
            ids, scores = res["ids"][0], res["scores"][0] or [0.0] * len(res["ids"][0])
        except Exception as exc:  # chromadb raises its own types
            self.sparse_unavailable = short_error(exc)
            return None
        # Chroma ranks ascending (a BM25 match scores as its negative); the order is the server's.
        return [(i, abs(float(s))) for i, s in zip(ids, scores)]


def chroma_paper_ids(store_dir: Path, collection: str) -> tuple[set[str], bool]:
    """Paper ids the embedded Chroma under `store_dir` names in `collection`'s metadata (ids only:
    Chroma holds no text), and whether it could be read at all; for `rag repair`, which cannot open
    a damaged store's `Store`."""
    ids: set[str] = set()
    if not (store_dir / "chroma").is_dir():
        return ids, False
    readable = False
    with contextlib.suppress(Exception):  # damaged or absent: the manifest's ids are all we have
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        client = chromadb.PersistentClient(
            path=str(store_dir / "chroma"), settings=ChromaSettings(anonymized_telemetry=False)
        )
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
    """Drop chromadb's per-path client cache: a client half-opened on damaged files would be handed
    out again for the same path after they are replaced."""
    with contextlib.suppress(Exception):
        from chromadb.api.shared_system_client import SharedSystemClient

        SharedSystemClient.clear_system_cache()


def no_such_collection(exc: Exception) -> bool:
    """Chroma's error for a collection that is not there (never made, or deleted under an open
    handle by another store's --rebuild): chromadb raises several types for it, all saying so."""
    return "does not exist" in str(exc)


def _disk_full(exc: Exception) -> bool:
    text = str(exc).lower()
    return "disk is full" in text or "no space left" in text or "disk i/o error" in text


def short_error(exc: Exception) -> str:
    """An exception as one short line (Chroma's messages can be long and multi-line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
