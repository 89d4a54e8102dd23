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
import math
import os
import re
import shutil
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

from rag.config import redact_url
from rag.errors import InputError, StoreError

if TYPE_CHECKING:
    import numpy as np

CHROMA_MAX_BATCH = 5000  # Chroma accepts at most 5,461 records per write
MAX_ID_CHARS = 1000  # a chunk id read from a server longer than this is not one of ours
MAX_META_VALUE = 4096  # characters of a collection metadata value read from a server
# Seconds any one request to a Chroma server may take (connecting, sending, waiting for the reply),
# and how long a server that failed one is not asked again (one question waits for it once).
SERVER_TIMEOUT = 15.0
SERVER_RETRY_AFTER = 30.0
# Collection metadata: the corpus's embedding model (the first ingest's), and the mark a --rebuild
# puts on the collection it makes (replicas then follow it rather than keep the old papers).
MODEL_KEY = "rag_embedding_model"
REBUILT_KEY = "rag_rebuilt"
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
    store_dir: Path, url: str | None, collection_name: Callable[[], str], text: bool = True
) -> ChromaVectors:
    """The Chroma vectors of a store: on the server at `url`, else embedded under
    `store_dir/chroma` (with each chunk's text when `text`: `Settings.chroma_text`).
    `collection_name` is asked when the collection is opened (the store reads it from its
    manifest)."""
    if url:
        return ChromaServer(url, store_dir, collection_name)
    return EmbeddedChroma(store_dir, collection_name, text)


class ChromaVectors(Vectors):
    """What embedded Chroma and a Chroma server share: one client and one collection, opened on
    first use and kept (thread-safe), batched writes and reads, cosine search."""

    def __init__(self, store_dir: Path, collection_name: Callable[[], str]) -> None:
        self.dir = store_dir
        self._name = collection_name
        self._client: Any = None
        self._collection: Any = None
        # reentrant: a server's request that fails while the collection opens drops the handle too
        self._lock = threading.RLock()
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
    def _open_collection(self, client: Any, create: bool) -> Any:
        """The collection; `create`: make it when absent (writes), else absence is an error."""

    @abstractmethod
    def _open_failed(self, exc: Exception) -> StoreError:
        """The error for a collection that cannot be opened."""

    @abstractmethod
    def _read_failed(self, exc: Exception, what: str) -> StoreError:
        """The error for a query or read that failed (`what`: "query", "read vectors from")."""

    def _metadatas(
        self, chunks: Sequence[ChunkIds], by_id: dict[str, Any], counts: dict[tuple[str, str], int]
    ) -> dict[str, Any]:
        """What is written beside each vector: the chunk's text, its paper's id and (when given)
        title and link, so that a plain LlamaIndex app reading the collection gets nodes with text
        and the paper named (docs/llamaindex.md); the rest of the paper is in papers.sqlite."""
        metadatas = []
        for c in chunks:
            paper = by_id.get(c.paper_id)
            fields = {"title": getattr(paper, "title", None), "url": getattr(paper, "url", None)}
            metadatas.append({"paper_id": c.paper_id, **{k: v for k, v in fields.items() if v}})
        return {"documents": [c.text for c in chunks], "metadatas": metadatas}

    def _warm_failed(self, exc: Exception) -> None:  # noqa: B027
        """A background warm-up failed: left to the query that follows (a server remembers it)."""

    def _query(self, collection: Any, vector: list[float], n: int) -> Any:
        return collection.query(query_embeddings=[vector], n_results=n, include=["distances"])

    # ---- the interface ----------------------------------------------------------------------

    def client(self) -> Any:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def collection(self, create: bool = False) -> Any:
        """The Chroma collection, opened on first use; `create`: made when absent (only writes do
        it: on a server, a reader must not re-create a collection deleted on purpose)."""
        with self._lock:
            if self._collection is None:
                client = self.client()
                try:
                    self._collection = self._open_collection(client, create)
                except StoreError:
                    raise
                except Exception as exc:
                    raise self._open_failed(exc) from None
            return self._collection

    def open(self) -> None:
        self.collection(create=True)

    def close(self) -> None:
        with self._lock:
            self._collection, self._client = None, None

    def write(
        self, chunks: Sequence[ChunkIds], vectors: list[list[float]], papers: Sequence[Any] = ()
    ) -> None:
        """Upsert in batches Chroma accepts."""
        collection = self.collection(create=True)
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
        collection = self.collection()
        try:
            n = collection.count()
        except Exception as exc:
            raise self._read_failed(exc, "count vectors in") from None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise self._read_failed(ValueError(f"a count of {str(n)[:40]!r}"), "count vectors in")
        return n

    def warm(self) -> None:
        """Open Chroma and load its nearest-neighbour index on a background thread, once: a first
        question then pays that (~1 s at 100k abstracts: importing chromadb, reading the HNSW
        index) while its own embedding model loads, not after. Errors are left to the query."""
        if self._collection is not None or self._warming is not None:
            return

        def warm() -> None:
            try:
                collection = self.collection()
                got = collection.get(limit=1, include=["embeddings"])
                if len(got["ids"]):
                    collection.query(
                        query_embeddings=[got["embeddings"][0]], n_results=1, include=["distances"]
                    )
            except Exception as exc:
                self._warm_failed(exc)

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
            return _hits(res["ids"][0], [1.0 - float(d) for d in res["distances"][0]])
        except StoreError:
            raise
        except Exception as exc:  # chromadb's own types, or a reply of the wrong shape
            raise self._read_failed(exc, "query") from None

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
                got_ids = _hits(got["ids"], [0.0] * len(got["ids"]))
                if got_ids:
                    matrix = np.asarray(got["embeddings"], dtype=np.float32)
                    if matrix.ndim != 2 or len(matrix) != len(got_ids):
                        raise ValueError(
                            f"{len(got_ids)} ids but embeddings of shape {matrix.shape}"
                        )
            except StoreError:
                raise
            except Exception as exc:  # chromadb's own types (server gone, damaged files...)
                raise self._read_failed(exc, "read vectors from") from None
            if got_ids:
                ids.extend(i for i, _ in got_ids)
                parts.append(matrix)
        return ids, np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


class EmbeddedChroma(ChromaVectors):
    """Embedded Chroma under `store/chroma/`: one collection per store directory. It must write to
    open, so a full disk or a read-only store leaves it unreadable (`VectorsUnwritable`), as do
    damaged files (`VectorsDamaged`); questions then use keywords alone."""

    def __init__(
        self, store_dir: Path, collection_name: Callable[[], str], text: bool = True
    ) -> None:
        super().__init__(store_dir, collection_name)
        self._unwritable: VectorsUnwritable | None = None  # why it could not open, once it failed
        self.text = text  # each chunk's text beside its vector (Settings.chroma_text)

    def _metadatas(
        self, chunks: Sequence[ChunkIds], by_id: dict[str, Any], counts: dict[tuple[str, str], int]
    ) -> dict[str, Any]:
        written = super()._metadatas(chunks, by_id, counts)
        return written if self.text else {"metadatas": written["metadatas"]}

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

    def _open_collection(self, client: Any, create: bool) -> Any:
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


class ServerUnavailable(VectorsUnwritable):
    """The Chroma server did not answer within `SERVER_TIMEOUT`, could not be reached, or answered
    something that is not Chroma's reply. A store with caches answers from them (keyword retrieval)
    with one line saying so; the server is not asked again for `SERVER_RETRY_AFTER` s."""


class CollectionGone(VectorsUnwritable):
    """The store's collection is not on the server (deleted, or the server lost its data). Readers
    never re-create it (a deletion on purpose stays until an ingest); a store with caches answers
    from them, and `rag repair` pushes its papers back."""


class ChromaServer(ChromaVectors):
    """A collection on a Chroma server (`RAG_CHROMA_URL`). The server is the corpus: each chunk also
    carries its text and its paper's metadata (`server_record`), so stores sharing the collection
    build their caches from it (rag/index/replica.py). Beyond `Vectors`: replica bookkeeping, the
    collection's state, and Chroma's BM25 sparse search where the server has that index.

    The server is untrusted input: every request has a timeout (`SERVER_TIMEOUT`), every reply is
    checked for its shape, and a failure is one `ServerUnavailable` line, never a traceback."""

    def __init__(self, url: str, store_dir: Path, collection_name: Callable[[], str]) -> None:
        super().__init__(store_dir, collection_name)
        self.url = url
        self.sparse_unavailable: str | None = None  # why the server's BM25 index failed, if it did
        self._down: tuple[float, str] | None = None  # until when, and why, the server is not asked
        self._rebuilding = (
            False  # dropped by a --rebuild: the next collection made carries the mark
        )

    # ---- requests ---------------------------------------------------------------------------

    def _unavailable(self, exc: Exception | str) -> ServerUnavailable:
        """Remember that the server failed (`SERVER_RETRY_AFTER` s) and say why in one line."""
        if isinstance(exc, str):
            why = exc
        elif "timeout" in type(exc).__name__.lower() or "timed out" in str(exc).lower():
            why = f"no answer within {SERVER_TIMEOUT:g} s"
        else:
            why = short_error(exc)
        self._down = (time.monotonic() + SERVER_RETRY_AFTER, why)
        with self._lock:
            self._collection = None
        return ServerUnavailable(
            f"cannot reach Chroma at {redact_url(self.url)} ({why}); check RAG_CHROMA_URL and that"
            " the server is up"
        )

    def _check_down(self) -> None:
        if self._down is not None:
            until, why = self._down
            if time.monotonic() < until:
                raise ServerUnavailable(
                    f"cannot reach Chroma at {redact_url(self.url)} ({why}); check RAG_CHROMA_URL"
                    " and that the server is up"
                )
            self._down = None

    def _gone(self) -> CollectionGone:
        with self._lock:
            self._collection = None
        return CollectionGone(
            f"Chroma collection {self.name!r} is not on the server at {redact_url(self.url)}"
            f" (deleted, or the server lost its data); run `{repair_command(self.dir)}` to push"
            " this store's papers back to it"
        )

    def client(self) -> Any:
        self._check_down()
        return super().client()

    def collection(self, create: bool = False) -> Any:
        self._check_down()
        return super().collection(create)

    def _new_client(self) -> Any:
        """A client whose every request times out after `SERVER_TIMEOUT` s. chromadb's HTTP session
        waits forever and its constructor already makes requests (identity, tenant, database): it
        runs on a thread given `SERVER_TIMEOUT` s, then its session gets the timeout."""
        import chromadb
        import httpx
        from chromadb.config import Settings as ChromaSettings

        parsed = urlparse(self.url if "://" in self.url else f"http://{self.url}")
        made: list[Any] = []

        def make() -> None:
            try:
                made.append(
                    chromadb.HttpClient(
                        host=parsed.hostname or "127.0.0.1",
                        port=parsed.port or 8000,
                        ssl=parsed.scheme == "https",
                        settings=ChromaSettings(anonymized_telemetry=False),
                    )
                )
            except Exception as exc:  # chromadb raises several types for an unreachable server
                made.append(exc)

        # A daemon: a server that never answers must not keep the process from exiting (no native
        # code runs on it, only HTTP).
        thread = threading.Thread(target=make, name="rag-chroma-connect", daemon=True)
        thread.start()
        thread.join(SERVER_TIMEOUT)
        if not made:
            raise self._unavailable(f"no answer within {SERVER_TIMEOUT:g} s")
        if isinstance(made[0], Exception):
            raise self._unavailable(made[0])
        client = made[0]
        session = getattr(getattr(client, "_server", None), "_session", None)
        if isinstance(session, httpx.Client):
            session.timeout = httpx.Timeout(SERVER_TIMEOUT)
        return client

    def _request(self, call: Callable[[], Any]) -> Any:
        """One request: Chroma's "does not exist" passes through (callers decide what absence
        means); any other failure (a timeout, a refused connection, a reply that is not Chroma's)
        is `ServerUnavailable`."""
        try:
            return call()
        except StoreError:
            raise
        except Exception as exc:
            if no_such_collection(exc):
                raise
            raise self._unavailable(exc) from None

    def _open_collection(self, client: Any, create: bool) -> Any:
        """The collection; only a write (`create`) makes it when absent. A new collection gets
        Chroma's BM25 sparse index where the server accepts it (`sparse_schema`), and none where it
        does not (`chroma run`): keyword search then uses the local BM25 cache. One made after this
        store's --rebuild carries `REBUILT_KEY`, so that replicas follow it."""
        try:
            return self._request(lambda: client.get_collection(self.name, embedding_function=None))
        except StoreError:
            raise
        except Exception as exc:
            if not no_such_collection(exc):
                raise
            if not create:
                raise self._gone() from None
        metadata = None
        if self._rebuilding:
            metadata = {
                REBUILT_KEY: f"{replica_id(self.dir)[1]} {time.strftime('%Y-%m-%dT%H:%M:%S')}"
            }
        try:
            schema = sparse_schema()
        except (ImportError, ValueError):  # no snowballstemmer: the term weights cannot be computed
            schema = None
        if schema is not None:
            try:
                return client.create_collection(
                    self.name,
                    embedding_function=None,
                    schema=schema,
                    metadata=metadata,
                    get_or_create=True,
                )
            except Exception as exc:
                if SPARSE_REFUSED not in str(exc):
                    raise
        return client.get_or_create_collection(
            self.name,
            embedding_function=None,
            metadata=metadata,
            configuration={"hnsw": {"space": "cosine"}},
        )

    def _open_failed(self, exc: Exception) -> StoreError:
        return StoreError(
            f"cannot open Chroma collection {self.name!r} ({short_error(exc)}); "
            "check RAG_COLLECTION and RAG_CHROMA_URL"
        )

    def _read_failed(self, exc: Exception, what: str) -> StoreError:
        return self._gone() if no_such_collection(exc) else self._unavailable(exc)

    def _warm_failed(self, exc: Exception) -> None:
        if not isinstance(exc, StoreError) and not no_such_collection(exc):
            self._unavailable(exc)

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

    def drop(self) -> None:
        super().drop()
        self._rebuilding = True

    # ---- sharing a server -------------------------------------------------------------------

    def metadata(self) -> dict[str, str | int | float | bool]:
        """The collection's metadata, checked: text keys with short scalar values only (anything
        else on the server is ignored)."""
        raw = self._request(lambda: self.collection().metadata) or {}
        if not isinstance(raw, dict):
            return {}
        return {
            k: v
            for k, v in raw.items()
            if isinstance(k, str)
            and len(k) <= 200
            and isinstance(v, (str, int, float, bool))
            and len(str(v)) <= MAX_META_VALUE
        }

    def register(self, embedding_model: str) -> str:
        """Name this store in the collection's metadata (host:path), so that a `--rebuild` by
        another store can tell it is not alone, with the corpus's embedding model (the first
        ingest's); the collection's id. Read-modify-write: two first ingests at the same instant may
        leave one name out; the count check of `check_alone` still sees its vectors."""
        collection = self.collection(create=True)
        key, where = replica_id(self.dir)
        metadata = self.metadata()
        if metadata.get(key) != where or MODEL_KEY not in metadata:
            metadata[key] = where
            metadata.setdefault(MODEL_KEY, embedding_model)
            try:
                collection.modify(metadata=metadata)
            except Exception as exc:
                raise StoreError(
                    f"could not update Chroma collection {self.name!r} "
                    f"({short_error(exc)}); check RAG_CHROMA_URL"
                ) from None
        self._rebuilding = False
        return str(collection.id)

    def state(self) -> tuple[str, int] | None:
        """The collection's id and number of chunks (None when it does not exist): one request with
        an open handle. A collection deleted under the handle is looked up again; never made."""
        for _ in (0, 1):  # a handle to a deleted collection, then a fresh lookup
            try:
                collection = self.collection()
                count = self._request(collection.count)
                cid = collection.id
            except CollectionGone:
                return None
            except StoreError:
                raise
            except Exception as exc:
                with self._lock:
                    self._collection = None
                if not no_such_collection(exc):
                    raise self._unavailable(exc) from None
                continue
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise self._unavailable(f"a collection size of {str(count)[:40]!r}")
            return str(cid), count
        return None

    def others(self, metadata: dict[str, Any]) -> list[str]:
        """The other stores the collection's metadata names (host:path), checked: the key must be
        the one `replica_id` makes of the value, and on this host the store directory must exist
        (a forged, malformed or stale name does not make a collection shared)."""
        own, _ = replica_id(self.dir)
        host = socket.gethostname()
        names = []
        for key, value in metadata.items():
            if not key.startswith(REPLICA_KEY) or key == own or not isinstance(value, str):
                continue
            if REPLICA_KEY + hashlib.sha1(value.encode()).hexdigest()[:12] != key:
                continue
            name, sep, path = value.partition(":")
            if not sep or not path.startswith("/"):
                continue
            if name == host and not (Path(path) / "papers.sqlite").is_file():
                continue
            names.append(value)
        return sorted(names)

    def check_alone(self, own_chunks: Callable[[], int]) -> None:
        """Refuse a `--rebuild` that would delete other stores' vectors: a collection that names
        other stores (`others`), or holds more vectors than this store has chunks (`own_chunks()`),
        is shared (`CollectionShared`)."""
        try:
            self.collection()
        except CollectionGone:
            return  # no such collection: nothing to lose
        others = self.others(self.metadata())
        extra = self.count() - own_chunks()
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
        """The embedding model the collection's metadata names (the first ingest's, or anyone's
        who wrote there: the caller decides whether to believe it)."""
        value = self.metadata().get(MODEL_KEY)
        return value if isinstance(value, str) and 0 < len(value) <= 200 else None

    def rebuilt_mark(self) -> str | None:
        """The mark a --rebuild put on the collection it made (`REBUILT_KEY`), if any."""
        value = self.metadata().get(REBUILT_KEY)
        return value if isinstance(value, str) else None

    def all_ids(self, page: int = CHROMA_MAX_BATCH) -> list[str]:
        """Every chunk id in the collection, in the server's order (the order they were written),
        read `page` at a time. Ids that are not text, and pages that repeat, end the read."""
        collection = self.collection()
        ids: list[str] = []
        seen: set[str] = set()
        while True:
            got = self._request(partial(collection.get, include=[], limit=page, offset=len(ids)))
            try:
                part = [i for i, _ in _hits(got["ids"], [0.0] * len(got["ids"]))]
            except (KeyError, TypeError, ValueError) as exc:
                raise self._unavailable(exc) from None
            new = [i for i in dict.fromkeys(part) if i not in seen]
            if not new:
                return ids
            seen.update(new)
            ids.extend(new)

    def records(self, chunk_ids: list[str]) -> list[tuple[str, Any, Any]]:
        """(chunk id, text, metadata) of these chunks as the server holds them, in one request: the
        reply's shape is checked here, the values by the caller (rag/index/replica.py). Only ids
        asked for are returned."""
        got = self._request(
            lambda: self.collection().get(ids=chunk_ids, include=["documents", "metadatas"])
        )
        try:
            ids = [i for i, _ in _hits(got["ids"], [0.0] * len(got["ids"]))]
            n = len(ids)
            texts = got.get("documents") or [None] * n
            metas = got.get("metadatas") or [None] * n
            if not isinstance(texts, list) or not isinstance(metas, list):
                raise ValueError("documents or metadatas that are not lists")
            if len(texts) != n or len(metas) != n:
                raise ValueError("documents or metadatas that do not pair up with the ids")
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise self._unavailable(exc) from None
        asked = set(chunk_ids)
        return [(cid, t, m) for cid, t, m in zip(ids, texts, metas) if cid in asked]

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
            # Chroma ranks ascending (a BM25 match scores as its negative); the order is the
            # server's.
            return [(i, abs(s)) for i, s in _hits(ids, [float(s) for s in scores])]
        except Exception as exc:  # chromadb raises its own types
            self.sparse_unavailable = short_error(exc)
            return None


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


def read_collection(path: Path, name: str | None) -> tuple[str, list[tuple[str, Any, Any]]]:
    """(collection name, its records as (id, document, metadata)) of a collection in the embedded
    Chroma under `path` (read-only use), for adopting another app's collection as a corpus
    (rag/index/adopt.py); `name` None: the directory's only collection. CorpusError, naming the
    fix, when it cannot be read."""
    from rag.errors import CorpusError

    try:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        client = chromadb.PersistentClient(
            path=str(path), settings=ChromaSettings(anonymized_telemetry=False)
        )
        names = sorted(c.name for c in client.list_collections())
    except Exception as exc:  # chromadb raises its own types for files it cannot read
        raise CorpusError(
            f"{path}: cannot open it as a Chroma directory ({short_error(exc)}); point at the"
            " directory a chromadb 1.5 PersistentClient wrote (it holds chroma.sqlite3)"
        ) from None
    return _records_named(client, names, str(path), name, lambda call: call())


def read_server_collection(url: str, name: str | None) -> tuple[str, list[tuple[str, Any, Any]]]:
    """`read_collection` for a collection on a Chroma server at `url` (read-only use: nothing is
    written), each request timed out as a shared server's are (`ChromaServer`)."""
    from rag.errors import CorpusError

    server = ChromaServer(url, Path("."), lambda: name or "")
    try:
        client = server.client()
        names = sorted(c.name for c in server._request(client.list_collections))
        return _records_named(client, names, url, name, server._request)
    except StoreError as exc:
        raise CorpusError(f"{url}: {exc}") from None


def _records_named(
    client: Any, names: list[str], where: str, name: str | None, request: Callable[[Any], Any]
) -> tuple[str, list[tuple[str, Any, Any]]]:
    """The collection `name` of `client` (its only one when None) read whole, a page a request."""
    from rag.errors import CorpusError

    if name is None:
        if len(names) != 1:
            listed = ", ".join(names[:10]) or "none"
            raise CorpusError(
                f"{where}: holds {len(names)} Chroma collections ({listed}); name one as"
                f" {where}/COLLECTION"
            )
        name = names[0]
    if name not in names:
        raise CorpusError(
            f"{where}/{name}: no Chroma collection {name!r} in {where} (it holds:"
            f" {', '.join(names[:10]) or 'none'}); name one as {where}/COLLECTION"
        )
    collection = request(lambda: client.get_collection(name))
    records: list[tuple[str, Any, Any]] = []
    while True:
        got = request(
            lambda: collection.get(
                include=["documents", "metadatas"], limit=CHROMA_MAX_BATCH, offset=len(records)
            )
        )
        ids = got.get("ids") if isinstance(got, dict) else None
        if not isinstance(ids, list):
            raise CorpusError(f"{where}/{name}: the reply to a read is not Chroma's; nothing read")
        if not ids:
            return name, records
        n = len(ids)
        docs, metas = got.get("documents") or [None] * n, got.get("metadatas") or [None] * n
        records.extend(zip(ids, docs, metas))


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


def _hits(ids: Any, values: list[float]) -> list[tuple[str, float]]:
    """(id, value) pairs of a reply, checked: ids are text, values finite numbers, as many of each
    (a server is untrusted input: a reply of another shape raises ValueError, never KeyError)."""
    if not isinstance(ids, list) or len(ids) != len(values):
        raise ValueError("a reply whose ids and values do not pair up")
    if not all(isinstance(i, str) and 0 < len(i) <= MAX_ID_CHARS for i in ids):
        raise ValueError("a reply holding an id that is not text")
    if not all(math.isfinite(v) for v in values):
        raise ValueError("a reply holding a distance that is not a number")
    return list(zip(ids, values))


def short_error(exc: Exception) -> str:
    """An exception as one short line (Chroma's messages can be long and multi-line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
