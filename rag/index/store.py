"""The index on disk: the only module that touches Chroma.

Layout of a store directory:
- `papers.sqlite`: the manifest and source of truth (papers, chunks, meta: schema version,
  embedding model). A chunk counts as indexed once its row is committed here.
- `keyword.json` + `keyword/`: the persisted BM25 index over the committed chunks (a manifest naming
  memory-mapped segments; each ingest appends segments, see rag/index/keyword.py).
- `chroma/`: embedded Chroma (unless `RAG_CHROMA_URL` points at a server).
- `map.npz`: the papers' 2-D map, laid out on first use (see rag/paper_map/layout.py).
- `.lock`: held by the one writer (embedded Chroma is not multi-process safe).

Writes go vectors first, rows second, in one SQLite transaction per batch: a killed ingest
leaves at most orphan vectors (ignored by queries, overwritten by the next run), never a
half-present paper.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlparse

from rag.config import Settings, redact_url
from rag.errors import StoreError
from rag.index.corpus import Paper

if TYPE_CHECKING:
    from rag.index.keyword import KeywordIndex

SCHEMA_VERSION = 1
# Meta key set while an ingest that includes corpus/ runs: a store killed then still owes it corpus/.
CORPUS_PENDING = "corpus_pending"
CHROMA_MAX_BATCH = 5000  # Chroma accepts at most 5,461 records per write

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS papers (
    paper_id TEXT PRIMARY KEY, title TEXT NOT NULL, label TEXT NOT NULL, authors TEXT NOT NULL,
    url TEXT, venue TEXT, year TEXT
);
CREATE TABLE IF NOT EXISTS chunks (
    rowid INTEGER PRIMARY KEY AUTOINCREMENT, chunk_id TEXT UNIQUE NOT NULL, paper_id TEXT NOT NULL,
    abstract_hash TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL, abstract TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_paper ON chunks (paper_id, abstract_hash);
"""


class Chunk(NamedTuple):
    """A chunk to add, in the column order of the `chunks` table."""

    chunk_id: str
    paper_id: str
    abstract_hash: str
    seq: int
    text: str
    abstract: str


@dataclass
class ChunkRow:
    rowid: int
    chunk_id: str
    paper_id: str
    text: str
    abstract: str


class Store:
    """Manifest + keyword index + vectors of one store directory. Safe to share between threads."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dir = settings.store_dir
        self.db_path = self.dir / "papers.sqlite"
        self.keyword_path = self.dir / "keyword.json"
        self.map_path = self.dir / "map.npz"
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []  # every thread's, for close()
        self._connections_lock = threading.Lock()
        self._collection = None
        self._client = None
        self._keyword: KeywordIndex | None = None
        self._keyword_stamp = None  # the manifest file's identity when _keyword was loaded
        self._keyword_lock = threading.Lock()
        self._chroma_lock = threading.Lock()
        self._warming: threading.Thread | None = None  # see warm_vectors
        self._unwritable: VectorsUnwritable | None = None  # why embedded Chroma could not open, once it failed
        self.vectors_unavailable: str | None = None  # why dense retrieval fell back to keywords, if it did

    # ---- location and manifest -------------------------------------------------------------

    @property
    def location(self) -> str:
        if self.settings.chroma_url:
            return f"{self.dir} (vectors on {redact_url(self.settings.chroma_url)}, collection {self.settings.collection})"
        return str(self.dir)

    def exists(self) -> bool:
        return self.db_path.exists()

    def check_readable(self) -> None:
        """Refuse to read a store that is not there: a mistyped --store must not answer as an empty
        index, or build a fresh one, without a word. (The default store builds itself instead.)"""
        if self.dir.exists() and not self.dir.is_dir():
            raise StoreError(f"{self.dir} is a file, not a store directory; point --store (or RAG_STORE_DIR) "
                             "at a directory")
        if not self.exists() and not self.settings.is_default_store:
            raise StoreError(f"there is no index at {self.dir}; check the path, or build one with "
                             f"`rag ingest FILE... --store {self.dir}` (the bundled papers: `rag ingest --store "
                             f"{self.dir}`)")

    def _db(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                if self.db_path.exists() and not os.access(self.dir, os.W_OK):
                    # WAL mode needs to create files even to read: open a read-only store immutable.
                    conn = self._immutable()
                else:
                    self.dir.mkdir(parents=True, exist_ok=True)
                    # Not bound to this thread: close() closes every thread's connection once they are done.
                    conn = sqlite3.connect(self.db_path, timeout=30, isolation_level=None, check_same_thread=False)
                    try:
                        conn.execute("PRAGMA journal_mode=WAL")
                        conn.execute("PRAGMA synchronous=NORMAL")
                        conn.executescript(_SCHEMA)
                    except sqlite3.OperationalError:
                        # A full disk: WAL's -wal and -shm files cannot be created, yet queries need
                        # not write. Read the committed database as it is; an ingest still fails
                        # at its first write, with its own message.
                        conn.close()
                        if not self.db_path.exists() or self.db_path.stat().st_size == 0:
                            raise
                        conn = self._immutable()
            except (sqlite3.Error, OSError) as exc:
                if _is_corruption(exc):  # not the path or its permissions: the file itself
                    raise damaged_manifest(self.dir, exc) from None
                raise StoreError(f"cannot open the store at {self.dir} ({exc}); check the path and its permissions, or set RAG_STORE_DIR") from None
            with self._connections_lock:
                self._connections.append(conn)
            conn = _Connection(conn, self.dir)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every thread's manifest connection (the last one checkpoints the WAL into the file) and
        let go of Chroma: for `rag repair`, which then moves the files. The store opens again on use."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        with self._chroma_lock:
            self._collection, self._client = None, None
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    def _immutable(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.db_path}?immutable=1", uri=True, isolation_level=None,
                               check_same_thread=False)

    def meta(self, key: str) -> str | None:
        row = self._db().execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def recorded_embedding_model(self) -> str | None:
        """The embedding model the store was built with; None when there is no readable store
        (whatever is wrong with it is reported by the first real use)."""
        if not self.exists():
            return None
        try:
            return self.meta("embedding_model")
        except (StoreError, sqlite3.Error):
            return None

    def has_author_named(self, word: str) -> bool:
        """Whether any paper's author list contains this word (case-insensitive); a full scan, for
        the rare question that names something absent from every abstract."""
        if not self.exists():
            return False
        spelled = json.dumps(word)[1:-1]  # as stored: JSON, non-ASCII letters escaped
        pattern = "%" + spelled.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        row = self._db().execute("SELECT 1 FROM papers WHERE authors LIKE ? ESCAPE '\\' LIMIT 1", (pattern,)).fetchone()
        return row is not None

    def check_compatible(self, embedding_model: str) -> None:
        """Refuse a store built by another embedding model or another schema version."""
        if not self.exists():
            return
        built_with, schema = self.meta("embedding_model"), self.meta("schema_version")
        if schema is not None and int(schema) != SCHEMA_VERSION:
            raise StoreError(
                f"the index at {self.dir} has schema version {schema}, this version needs {SCHEMA_VERSION}; "
                "rebuild it with `rag ingest --rebuild`"
            )
        if built_with is not None and built_with != embedding_model:
            raise StoreError(
                f"the index at {self.dir} was built with embedding model {built_with!r} but "
                f"RAG_EMBED_MODEL is {embedding_model!r}; set RAG_EMBED_MODEL={built_with}, or re-index every "
                f"paper it holds with the new model: RAG_EMBED_MODEL={embedding_model} rag repair --store {self.dir}"
            )

    def paper_count(self) -> int:
        if not self.exists():
            return 0
        return self._db().execute("SELECT COUNT(DISTINCT paper_id) FROM chunks").fetchone()[0]

    def chunk_count(self) -> int:
        if not self.exists():
            return 0
        return self._db().execute("SELECT COUNT(*) FROM chunks").fetchone()[0]

    def known_abstracts(self) -> set[tuple[str, str]]:
        """(paper_id, abstract_hash) of every indexed abstract: what an ingest can skip."""
        return set(self._db().execute("SELECT DISTINCT paper_id, abstract_hash FROM chunks"))

    def papers(self, paper_ids: list[str]) -> dict[str, Paper]:
        if not paper_ids:
            return {}
        marks = ",".join("?" * len(paper_ids))
        rows = self._db().execute(
            f"SELECT paper_id, title, label, authors, url, venue, year FROM papers WHERE paper_id IN ({marks})",
            paper_ids,
        )
        return {r[0]: Paper(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6]) for r in rows}

    def all_papers(self, abstracts: bool = True):
        """Every paper with its newest abstract, by paper id: (Paper, abstract) pairs streamed.
        With `abstracts=False` the abstract is None and not read (the map's titles need no abstracts)."""
        newest = ("(SELECT abstract FROM chunks c WHERE c.paper_id = p.paper_id ORDER BY c.rowid DESC LIMIT 1)"
                  if abstracts else "NULL")
        rows = self._db().execute(
            f"SELECT p.paper_id, p.title, p.label, p.authors, p.url, p.venue, p.year, {newest} "
            "FROM papers p WHERE EXISTS (SELECT 1 FROM chunks c WHERE c.paper_id = p.paper_id) ORDER BY p.paper_id")
        for r in rows:
            yield Paper(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6]), r[7]

    def chunk_papers_after(self, rowid: int) -> list[tuple[int, str, str]]:
        """(rowid, chunk_id, paper_id) of the committed chunks after `rowid`, oldest first."""
        return self._db().execute(
            "SELECT rowid, chunk_id, paper_id FROM chunks WHERE rowid > ? ORDER BY rowid", (rowid,)).fetchall()

    def chunks_by_rowid(self, rowids: list[int]) -> dict[int, ChunkRow]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self._db().execute(
            f"SELECT rowid, chunk_id, paper_id, text, abstract FROM chunks WHERE rowid IN ({marks})", rowids
        )
        return {r[0]: ChunkRow(*r) for r in rows}

    def rowids_for_chunk_ids(self, chunk_ids: list[str]) -> dict[str, int]:
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._db().execute(f"SELECT chunk_id, rowid FROM chunks WHERE chunk_id IN ({marks})", chunk_ids)
        return dict(rows.fetchall())

    # ---- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def writer(self):
        """Hold the store's write lock; a second writer is refused with a clear message."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fh = open(self.dir / ".lock", "a+")
        except OSError as exc:
            raise StoreError(f"cannot write to the store at {self.dir} ({exc.strerror}); check its permissions or set RAG_STORE_DIR") from None
        try:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"another ingest is writing to {self.dir}; wait for it to finish and run this again"
                ) from None
            yield self
        finally:
            fh.close()

    def init_meta(self, embedding_model: str) -> None:
        db = self._db()
        db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        db.execute("INSERT OR IGNORE INTO meta VALUES ('embedding_model', ?)", (embedding_model,))

    def set_meta(self, key: str, value: str | None) -> None:
        """Set a meta value (None removes it); committed at once."""
        if value is None:
            self._db().execute("DELETE FROM meta WHERE key=?", (key,))
        else:
            self._db().execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def add(self, papers: list[Paper], chunks: list[Chunk], vectors: list[list[float]]) -> None:
        """Add papers and their chunks with the chunks' vectors.

        Vectors are written first; the rows are committed in one transaction afterwards.
        """
        collection = self.collection()
        for start in range(0, len(chunks), CHROMA_MAX_BATCH):
            part = chunks[start:start + CHROMA_MAX_BATCH]
            try:
                collection.upsert(
                    ids=[c.chunk_id for c in part],
                    embeddings=vectors[start:start + CHROMA_MAX_BATCH],
                    metadatas=[{"paper_id": c.paper_id} for c in part],
                )
            except Exception as exc:  # chromadb raises its own types (disk full, server gone...)
                raise StoreError(
                    f"could not write vectors to Chroma ({_short(exc)}); free disk space or check "
                    "RAG_CHROMA_URL, then run the ingest again (it resumes)"
                ) from None
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            for p in papers:
                db.execute(
                    "INSERT INTO papers VALUES (?,?,?,?,?,?,?) ON CONFLICT(paper_id) DO UPDATE SET "
                    "title=CASE WHEN papers.title='' THEN excluded.title ELSE papers.title END, "
                    "authors=CASE WHEN papers.authors='[]' THEN excluded.authors ELSE papers.authors END, "
                    "url=COALESCE(papers.url, excluded.url), venue=COALESCE(papers.venue, excluded.venue), "
                    "year=COALESCE(papers.year, excluded.year)",
                    (p.paper_id, p.title, p.label, json.dumps(p.authors), p.url, p.venue, p.year),
                )
            db.executemany(
                "INSERT OR IGNORE INTO chunks (chunk_id, paper_id, abstract_hash, seq, text, abstract) "
                "VALUES (?,?,?,?,?,?)", chunks,
            )
            db.execute("COMMIT")
        except (sqlite3.Error, StoreDamaged) as exc:
            if db.in_transaction:  # a full disk may already have rolled it back
                with contextlib.suppress(sqlite3.Error, StoreDamaged):
                    db.execute("ROLLBACK")
            if isinstance(exc, StoreDamaged):
                raise
            raise StoreError(f"could not write to {self.db_path} ({exc}); free disk space or check permissions, then run the ingest again") from None

    def clear(self) -> None:
        """Empty the store (for `--rebuild`): vectors, rows and keyword index."""
        # Delete through the client: Chroma caches one client per path, so removing its files
        # under a live client leaves that client writing to a deleted (read-only) database.
        try:
            client = self._chroma_client()
        except VectorsDamaged:
            # Embedded Chroma's files cannot be opened: nothing in them can be deleted through it.
            client = None
            self._unwritable = None
            _forget_chroma_clients()
            shutil.rmtree(self.dir / "chroma", ignore_errors=True)
        if client is not None:
            with contextlib.suppress(Exception):  # absent collection: nothing to delete
                client.delete_collection(self.settings.collection)
        self._collection = None
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        for name in ("papers.sqlite", "papers.sqlite-wal", "papers.sqlite-shm", "keyword.npz", "keyword.json",
                     self.map_path.name):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
        shutil.rmtree(self.keyword_path.with_suffix(""), ignore_errors=True)
        self._keyword = None

    # ---- keyword index ---------------------------------------------------------------------

    def last_rowid(self) -> int:
        """The newest committed chunk's rowid (-1 when none): rowids only grow, so this says whether
        the keyword index covers every chunk, in one index lookup (COUNT(*) would scan the table)."""
        if not self.exists():
            return -1
        row = self._db().execute("SELECT MAX(rowid) FROM chunks").fetchone()
        return -1 if row[0] is None else int(row[0])

    def _rows_after(self, rowid: int):
        # Rows stream through the cursor: the chunk texts are never all in memory at once.
        return self._db().execute("SELECT rowid, text FROM chunks WHERE rowid > ? ORDER BY rowid", (rowid,))

    def _manifest_stamp(self):
        try:
            st = self.keyword_path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load_keyword_index(self):
        """The persisted index, or None when it is missing, unreadable, of an older format, or not
        an index of these chunks (the store was rebuilt under it)."""
        from rag.index.keyword import KeywordIndex

        for _ in range(2):  # a concurrent ingest may remove a segment between manifest and segments
            if not self.keyword_path.exists():
                return None
            try:
                index = KeywordIndex.load(self.keyword_path)
            except (OSError, ValueError, KeyError, TypeError):
                continue
            return index if index.last_key <= self.last_rowid() else None
        return None

    def keyword_index_stale(self) -> bool:
        """The persisted keyword index is missing, unreadable, of an older format, or does not cover
        the committed chunks."""
        index = self._load_keyword_index()
        if index is None:
            return self.chunk_count() > 0
        return index.last_key != self.last_rowid() or len(index) != self.chunk_count()

    def update_keyword_index(self) -> None:
        """Bring the persisted keyword index up to the committed chunks (the caller holds the write
        lock): the chunks it lacks are appended as new segments, written as they are built; a full
        build only when there is no readable index."""
        from rag.index.keyword import KeywordIndex

        index = self._load_keyword_index()
        if index is not None and len(index) != self._db().execute(
                "SELECT COUNT(*) FROM chunks WHERE rowid <= ?", (index.last_key,)).fetchone()[0]:
            index = None  # it covers other chunks than these: start over
        segments = self.keyword_path.with_suffix("")
        try:
            index = index or KeywordIndex([])
            if index.last_key < self.last_rowid():
                index = index.appended(self._rows_after(index.last_key), segments)
            index.save(self.keyword_path)
            with contextlib.suppress(FileNotFoundError):  # the single-file index of earlier versions
                (self.dir / "keyword.npz").unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.keyword_path.with_name(self.keyword_path.name + ".tmp").unlink()
            raise StoreError(f"could not write the keyword index in {self.dir} ({exc.strerror}); free disk space and "
                             "run the ingest again") from None
        with self._keyword_lock:
            self._keyword, self._keyword_stamp = index, self._manifest_stamp()

    def keyword_index(self):
        """The keyword index over every committed chunk: the persisted one (memory-mapped, reloaded
        when an ingest replaces it), with any chunks it lacks (an ingest running or killed) appended
        in memory."""
        from rag.index.keyword import KeywordIndex

        with self._keyword_lock:
            stamp = self._manifest_stamp()
            if self._keyword is None or stamp != self._keyword_stamp:
                self._keyword, self._keyword_stamp = self._load_keyword_index(), stamp
            last = self.last_rowid()
            index = self._keyword
            if index is None or index.last_key > last:  # none, or the store was rebuilt under it
                index = KeywordIndex([])
            if index.last_key < last:
                index = index.appended(self._rows_after(index.last_key))
            self._keyword = index
            return index

    # ---- vectors -----------------------------------------------------------------------------

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
                raise StoreError(f"cannot reach Chroma at {where} ({_short(exc)}); check RAG_CHROMA_URL, "
                                 "free disk space, or check the store directory") from None
        return self._client

    def collection(self):
        with self._chroma_lock:
            if self._collection is None:
                client = self._chroma_client()
                try:
                    self._collection = client.get_or_create_collection(
                        self.settings.collection, embedding_function=None,
                        configuration={"hnsw": {"space": "cosine"}},
                    )
                except Exception as exc:
                    if not self.settings.chroma_url:
                        raise damaged_vectors(self.dir, exc) from None
                    raise StoreError(f"cannot open Chroma collection {self.settings.collection!r} ({exc}); check RAG_COLLECTION and RAG_CHROMA_URL") from None
            return self._collection

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
            res = collection.query(query_embeddings=[vector], n_results=n, include=["distances"])
        except Exception as exc:
            if self.settings.chroma_url:
                raise StoreError(f"could not query Chroma at {redact_url(self.settings.chroma_url)} ({_short(exc)}); "
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
                raise StoreError(f"could not read vectors from Chroma ({_short(exc)}); check RAG_CHROMA_URL "
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


class VectorsUnwritable(StoreError):
    """Embedded Chroma cannot open the vectors without writing (full disk, read-only store)."""


class VectorsDamaged(VectorsUnwritable):
    """Embedded Chroma's files cannot be read (truncated, garbled). Handled like an unwritable store:
    questions fall back to keyword retrieval with one warning; `rag repair` re-indexes the vectors."""


class StoreDamaged(StoreError):
    """papers.sqlite cannot be read as it is (a damaged header or pages); `rag repair` keeps what it can."""


def repair_command(store_dir: Path) -> str:
    return f"rag repair --store {store_dir}"


def damaged_manifest(store_dir: Path, exc: Exception) -> StoreDamaged:
    return StoreDamaged(f"the store's papers.sqlite in {store_dir} is damaged ({_short(exc)}); run "
                        f"`{repair_command(store_dir)}` to re-index every paper it still holds (the damaged files "
                        "are kept)")


def damaged_vectors(store_dir: Path, exc: Exception) -> VectorsDamaged:
    return VectorsDamaged(f"the vectors in {store_dir / 'chroma'} cannot be read ({_short(exc)}); run "
                          f"`{repair_command(store_dir)}` to re-index them from papers.sqlite (it keeps every paper)")


# SQLite's primary result codes for a damaged file: SQLITE_CORRUPT ("database disk image is malformed")
# and SQLITE_NOTADB ("file is not a database", e.g. a damaged header).
_CORRUPTION_CODES = (11, 26)


def _is_corruption(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and code is not None and code & 0xFF in _CORRUPTION_CODES


class _Cursor(sqlite3.Cursor):
    """A cursor whose reads of a damaged page (which may come mid-iteration) raise StoreDamaged, naming the
    fix, instead of sqlite3.DatabaseError: every caller of the store then gets one line, not a traceback."""

    store_dir: Path

    def _damaged(self, exc: sqlite3.DatabaseError) -> Exception:
        return damaged_manifest(self.store_dir, exc) if _is_corruption(exc) else exc

    def execute(self, sql, parameters=(), /):
        try:
            return super().execute(sql, parameters)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def executemany(self, sql, seq_of_parameters, /):
        try:
            return super().executemany(sql, seq_of_parameters)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def fetchone(self):
        try:
            return super().fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def fetchall(self):
        try:
            return super().fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def __next__(self):
        try:
            return super().__next__()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None


class _Connection:
    """The manifest's connection, giving `_Cursor`s (sqlite3.Connection.execute makes its cursor in C, so
    a subclass cannot)."""

    def __init__(self, conn: sqlite3.Connection, store_dir: Path) -> None:
        self.conn, self.store_dir = conn, store_dir

    def _cursor(self) -> _Cursor:
        cursor = self.conn.cursor(_Cursor)
        cursor.store_dir = self.store_dir
        return cursor

    def execute(self, sql: str, parameters=()) -> _Cursor:
        return self._cursor().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters) -> _Cursor:
        return self._cursor().executemany(sql, seq_of_parameters)

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def close(self) -> None:
        self.conn.close()


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
    _forget_chroma_clients()
    return ids, readable


# ---- rebuild -----------------------------------------------------------------------------------


def _forget_chroma_clients() -> None:
    """Drop chromadb's per-path client cache: a client half-opened on damaged files would be handed out
    again for the same path after they are replaced."""
    with contextlib.suppress(Exception):
        from chromadb.api.shared_system_client import SharedSystemClient

        SharedSystemClient.clear_system_cache()


def _disk_full(exc: Exception) -> bool:
    text = str(exc).lower()
    return "disk is full" in text or "no space left" in text or "disk i/o error" in text


def store_size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _short(exc: Exception) -> str:
    """An exception as one short line (Chroma's messages can be long and multi-line)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
