"""The index on disk: the manifest (`papers.sqlite`, the source of truth), the writer lock and the
keyword index's bookkeeping. The vectors are a delegate, `Store.vector_index` (embedded Chroma, a
Chroma server, or in memory for tests); nothing outside rag/index/ reaches into them.

Writes go vectors first, rows second, in one SQLite transaction per batch: a killed ingest leaves at
most orphan vectors (ignored by queries, overwritten by the next run), never a half-present paper.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from rag.config import Settings, keyword_stemmer_for, redact_url
from rag.errors import StoreError
from rag.index.corpus import Paper
from rag.index.vectors import (
    DEFAULT_COLLECTION,
    ChromaServer,
    ChromaVectors,
    Vectors,
    VectorsUnwritable,
    chroma_vectors,
    derived_collection_name,
    repair_command,
    replica_id,
    short_error,
)
from rag.text import KEYWORD_STEMMERS

if TYPE_CHECKING:
    import numpy as np

    from rag.index.keyword import KeywordIndex

SCHEMA_VERSION = 1
# Meta key set while an ingest that includes corpus/ runs: a store killed then still owes it
# corpus/.
CORPUS_PENDING = "corpus_pending"
# Meta key: where the store was made (host:path), so that a copy of its directory is told apart
# before it writes into the original's collection on a server (`Store.check_home`).
STORE_HOME = "store_home"

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
    """Manifest + keyword index + vectors of one store directory. Safe to share between threads.
    `vectors`: the vectors to use (e.g. `MemoryVectors()` in tests); by default Chroma, embedded or
    on the server the settings name."""

    def __init__(self, settings: Settings, vectors: Vectors | None = None) -> None:
        self.settings = settings
        self.dir = settings.store_dir
        self.db_path = self.dir / "papers.sqlite"
        self.keyword_path = self.dir / "keyword.json"
        self.map_path = self.dir / "map.npz"
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []  # every thread's, for close()
        self._connections_lock = threading.Lock()
        self._keyword: KeywordIndex | None = None
        self._keyword_stamp = None  # the manifest file's identity when _keyword was loaded
        self._keyword_lock = threading.Lock()
        # The collection's name is read when Chroma opens it: from the manifest, once there is one.
        self.vector_index: Vectors = (
            vectors
            if vectors is not None
            else chroma_vectors(
                self.dir, settings.chroma_url, lambda: self.collection_name, settings.chroma_text
            )
        )
        # why dense retrieval fell back to keywords, if it did
        self.vectors_unavailable: str | None = None
        # the server's state the caches were last level with
        self.synced_state: tuple[str, int] | None = None

    # ---- location and manifest -------------------------------------------------------------

    @property
    def location(self) -> str:
        if self.settings.chroma_url:
            return (
                f"{self.dir} (vectors on {redact_url(self.settings.chroma_url)}, collection"
                f" {self.collection_name})"
            )
        return str(self.dir)

    @property
    def collection_name(self) -> str:
        """The Chroma collection of this store: `RAG_COLLECTION` when set; else the name the store
        recorded at its first ingest; else `papers` in embedded Chroma (one per store directory) and
        in a store built on a server before names were recorded; else, for a new store on a server,
        a name of its own (`derived_collection_name`): two stores never share a collection unless
        told to."""
        if self.settings.collection:
            return self.settings.collection
        recorded = None
        # a damaged manifest: its repair reports it
        with contextlib.suppress(StoreError, sqlite3.Error):
            recorded = self.meta("collection") if self.exists() else None
        if recorded:
            return recorded
        if not self.settings.chroma_url:
            return DEFAULT_COLLECTION
        with contextlib.suppress(StoreError, sqlite3.Error):
            if self.last_rowid() >= 0:
                return DEFAULT_COLLECTION
        return derived_collection_name(self.dir)

    def exists(self) -> bool:
        return self.db_path.exists()

    def check_readable(self) -> None:
        """Refuse to read a store that is not there: a mistyped --store must not answer as an empty
        index, or build a fresh one, without a word. (The default store builds itself instead.)"""
        if self.dir.exists() and not self.dir.is_dir():
            raise StoreError(
                f"{self.dir} is a file, not a store directory; point --store (or RAG_STORE_DIR) "
                "at a directory"
            )
        # caught up with the server: it holds no paper
        if not self.exists() and self.settings.chroma_url:
            raise StoreError(no_papers_on_server(self.collection_name))
        if not self.exists() and not self.settings.is_default_store:
            raise StoreError(
                f"there is no index at {self.dir}; check the path, or build one with "
                f"`rag ingest FILE... --store {self.dir}` (the bundled papers: `rag ingest --store "
                f"{self.dir}`)"
            )

    def _db(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                if self.db_path.exists() and not os.access(self.dir, os.W_OK):
                    # WAL mode needs to create files even to read: open a read-only store immutable.
                    conn = self._immutable()
                else:
                    self.dir.mkdir(parents=True, exist_ok=True)
                    # Not bound to this thread: close() closes every thread's connection once they
                    # are done.
                    conn = sqlite3.connect(
                        self.db_path, timeout=30, isolation_level=None, check_same_thread=False
                    )
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
                raise StoreError(
                    f"cannot open the store at {self.dir} ({exc}); check the path and its"
                    " permissions, or set RAG_STORE_DIR"
                ) from None
            with self._connections_lock:
                self._connections.append(conn)
            conn = _Connection(conn, self.dir)
            self._local.conn = conn
        return conn

    def close(self) -> None:
        """Close every thread's manifest connection (the last one checkpoints the WAL into the file)
        and let go of Chroma: for `rag repair`, which then moves the files. The store opens again on
        use."""
        self.vector_index.close()
        self._close_connections()

    def quick_check(self) -> str:
        """SQLite's quick integrity check of the manifest: "ok", or what is wrong (`rag doctor`)."""
        return str(self._db().execute("PRAGMA quick_check").fetchone()[0])

    def _close_connections(self) -> None:
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()

    def _immutable(self) -> sqlite3.Connection:
        return sqlite3.connect(
            f"file:{self.db_path}?immutable=1",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )

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
        row = (
            self._db()
            .execute("SELECT 1 FROM papers WHERE authors LIKE ? ESCAPE '\\' LIMIT 1", (pattern,))
            .fetchone()
        )
        return row is not None

    def check_compatible(self, embedding_model: str) -> None:
        """Refuse a store built by another embedding model or another schema version."""
        if not self.exists():
            return
        built_with, schema = self.meta("embedding_model"), self.meta("schema_version")
        if schema is not None and int(schema) != SCHEMA_VERSION:
            raise StoreError(
                f"the index at {self.dir} has schema version {schema}, this version needs"
                f" {SCHEMA_VERSION}; rebuild it with `rag ingest --rebuild`"
            )
        if built_with is not None and built_with != embedding_model:
            raise StoreError(
                f"the index at {self.dir} was built with embedding model {built_with!r} but"
                f" RAG_EMBED_MODEL is {embedding_model!r}; set RAG_EMBED_MODEL={built_with}, or"
                " re-index every paper it holds with the new model:"
                f" RAG_EMBED_MODEL={embedding_model} rag repair --store {self.dir}"
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
            "SELECT paper_id, title, label, authors, url, venue, year FROM papers WHERE paper_id"
            f" IN ({marks})",
            paper_ids,
        )
        return {r[0]: Paper(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6]) for r in rows}

    def all_papers(self, abstracts: bool = True):
        """Every paper with its newest abstract, by paper id: (Paper, abstract) pairs streamed. With
        `abstracts=False` the abstract is None and not read (the map's titles need no abstracts)."""
        newest = (
            "(SELECT abstract FROM chunks c WHERE c.paper_id = p.paper_id ORDER BY c.rowid DESC"
            " LIMIT 1)"
            if abstracts
            else "NULL"
        )
        rows = self._db().execute(
            f"SELECT p.paper_id, p.title, p.label, p.authors, p.url, p.venue, p.year, {newest} FROM"
            " papers p WHERE EXISTS (SELECT 1 FROM chunks c WHERE c.paper_id = p.paper_id) ORDER"
            " BY p.paper_id"
        )
        for r in rows:
            yield Paper(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6]), r[7]

    def chunk_papers_after(self, rowid: int) -> list[tuple[int, str, str]]:
        """(rowid, chunk_id, paper_id) of the committed chunks after `rowid`, oldest first."""
        return (
            self._db()
            .execute(
                "SELECT rowid, chunk_id, paper_id FROM chunks WHERE rowid > ? ORDER BY rowid",
                (rowid,),
            )
            .fetchall()
        )

    def chunks_by_rowid(self, rowids: list[int]) -> dict[int, ChunkRow]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self._db().execute(
            "SELECT rowid, chunk_id, paper_id, text, abstract FROM chunks WHERE rowid IN"
            f" ({marks})",
            rowids,
        )
        return {r[0]: ChunkRow(*r) for r in rows}

    def chunk_texts(self, paper_ids: list[str]) -> dict[str, list[str]]:
        """The embedded texts of each of these papers' chunks."""
        if not paper_ids:
            return {}
        marks = ",".join("?" * len(paper_ids))
        out: dict[str, list[str]] = {}
        for paper_id, text in self._db().execute(
            f"SELECT paper_id, text FROM chunks WHERE paper_id IN ({marks}) ORDER BY rowid",
            paper_ids,
        ):
            out.setdefault(paper_id, []).append(text)
        return out

    def abstracts_chunks(self) -> Iterator[list[Chunk]]:
        """Every abstract's chunks (in seq order), abstract by abstract, streamed (for pushing a
        store's papers back to a server)."""
        rows = self._db().execute(
            "SELECT chunk_id, paper_id, abstract_hash, seq, text, abstract FROM chunks ORDER BY"
            " paper_id, abstract_hash, seq"
        )
        group: list[Chunk] = []
        for row in rows:
            chunk = Chunk(*row)
            if group and (group[0].paper_id, group[0].abstract_hash) != (
                chunk.paper_id,
                chunk.abstract_hash,
            ):
                yield group
                group = []
            group.append(chunk)
        if group:
            yield group

    def chunk_ids(self) -> set[str]:
        return {r[0] for r in self._db().execute("SELECT chunk_id FROM chunks")}

    def sample_chunk_ids(self, n: int) -> list[str]:
        """Up to `n` chunk ids spread over the manifest (for checks that its vectors are where they
        should be)."""
        if not self.exists():
            return []
        last = self.last_rowid()
        if last < 0:
            return []
        step = max(1, last // n)
        rows = (
            self._db()
            .execute("SELECT chunk_id FROM chunks WHERE rowid % ? = 0 LIMIT ?", (step, n))
            .fetchall()
        )
        return [r[0] for r in rows] or [
            r[0] for r in self._db().execute("SELECT chunk_id FROM chunks LIMIT ?", (n,))
        ]

    def rowids_for_chunk_ids(self, chunk_ids: list[str]) -> dict[str, int]:
        if not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self._db().execute(
            f"SELECT chunk_id, rowid FROM chunks WHERE chunk_id IN ({marks})", chunk_ids
        )
        return dict(rows.fetchall())

    # ---- writing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def writer(self):
        """Hold the store's write lock; a second writer is refused with a clear message."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            ignore = self.dir / ".gitignore"
            if not ignore.exists():
                # A store is data: made inside a checkout (`--store my-papers`), git leaves it out.
                ignore.write_text("# a rag store: data, not code\n*\n")
            fh = open(self.dir / ".lock", "a+")
        except OSError as exc:
            raise StoreError(
                f"cannot write to the store at {self.dir} ({exc.strerror}); check its permissions"
                " or set RAG_STORE_DIR"
            ) from None
        try:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"another ingest is writing to {self.dir}; wait for it to finish and run this"
                    " again"
                ) from None
            yield self
        finally:
            fh.close()

    def init_meta(self, embedding_model: str) -> None:
        """Record what a new store is built with (an existing store keeps what it recorded)."""
        db = self._db()
        if db.execute("SELECT 1 FROM meta WHERE key='embedding_model'").fetchone() is None:
            # A store built before stemmers were recorded has none: it is light (keyword_stemmer).
            db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('keyword_stemmer', ?)",
                (keyword_stemmer_for(self.settings.keyword_stemmer, embedding_model),),
            )
        db.execute(
            "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        db.execute("INSERT OR IGNORE INTO meta VALUES ('embedding_model', ?)", (embedding_model,))
        db.execute("INSERT OR IGNORE INTO meta VALUES ('collection', ?)", (self.collection_name,))
        if self.server is not None:
            db.execute(
                "INSERT OR IGNORE INTO meta VALUES (?, ?)", (STORE_HOME, replica_id(self.dir)[1])
            )

    def check_home(self) -> None:
        """Before a write to a Chroma server (the caller holds the write lock): refuse when this
        directory is a copy of another store's (`cp -r`), whose recorded collection it would
        otherwise write into unasked. Naming the collection (RAG_COLLECTION, --collection) is
        asking: the store is then at home here. Embedded Chroma: a copy is independent."""
        if self.server is None or not self.exists():
            return
        here = replica_id(self.dir)[1]
        home = self.meta(STORE_HOME)
        if home is not None and home != here and not self.settings.collection:
            name = self.collection_name
            raise StoreError(
                f"the store at {self.dir} is a copy of the one at {home}, and writing here would"
                f" change that store's corpus (Chroma collection {name!r}); pass --collection"
                f" {name} to write into it on purpose, or --collection NEW_NAME for a corpus of"
                " its own"
            )
        if home != here:
            self.set_meta(STORE_HOME, here)

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
        self.vector_index.write(chunks, vectors, papers)
        self.add_rows(papers, chunks)

    def add_rows(self, papers: list[Paper], chunks: list[Chunk]) -> None:
        """Commit papers and chunks to the manifest in one transaction (their vectors are already
        written)."""
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            for p in papers:
                db.execute(
                    "INSERT INTO papers VALUES (?,?,?,?,?,?,?) ON CONFLICT(paper_id) DO UPDATE SET"
                    " title=CASE WHEN papers.title='' THEN excluded.title ELSE papers.title END,"
                    " authors=CASE WHEN papers.authors='[]' THEN excluded.authors ELSE"
                    " papers.authors END, url=COALESCE(papers.url, excluded.url),"
                    " venue=COALESCE(papers.venue, excluded.venue), year=COALESCE(papers.year,"
                    " excluded.year)",
                    (p.paper_id, p.title, p.label, json.dumps(p.authors), p.url, p.venue, p.year),
                )
            db.executemany(
                "INSERT OR IGNORE INTO chunks (chunk_id, paper_id, abstract_hash, seq, text,"
                " abstract) VALUES (?,?,?,?,?,?)",
                chunks,
            )
            db.execute("COMMIT")
        except (sqlite3.Error, StoreDamaged) as exc:
            if db.in_transaction:  # a full disk may already have rolled it back
                with contextlib.suppress(sqlite3.Error, StoreDamaged):
                    db.execute("ROLLBACK")
            if isinstance(exc, StoreDamaged):
                raise
            raise StoreError(
                f"could not write to {self.db_path} ({exc}); free disk space or check permissions,"
                " then run the ingest again"
            ) from None

    def clear(self) -> None:
        """Empty the store (for `--rebuild`): vectors, rows and keyword index. The collection's name
        stays."""
        self.vector_index.drop()
        self.clear_caches()

    def set_caches_aside(self) -> Path:
        """Move the manifest, the keyword index and the map into `replaced-<time>/` (kept, never
        deleted: another store's --rebuild replaced the collection they were built from). The
        collection's name stays. Where they went."""
        collection = self.collection_name
        self._close_connections()
        aside = self.dir / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir(exist_ok=True)
        for name in (*self._cache_files(), self.keyword_path.with_suffix("").name):
            if (self.dir / name).exists():
                os.replace(self.dir / name, aside / name)
        self._keyword = None
        if not self.settings.collection:
            self.set_meta("collection", collection)
        return aside

    def _cache_files(self) -> tuple[str, ...]:
        """The files a store keeps beside the vectors: the manifest, the keyword index, the map."""
        return (
            "papers.sqlite",
            "papers.sqlite-wal",
            "papers.sqlite-shm",
            "keyword.npz",
            "keyword.json",
            self.map_path.name,
        )

    def clear_caches(self) -> None:
        """Delete the manifest, the keyword index and the map, not the vectors (on a server they are
        the corpus, and the caches are rebuilt from it). The collection's name stays."""
        collection = self.collection_name
        # Every thread's connection, not only this one's: a thread of a server would otherwise go on
        # reading the deleted file. (A query running at this instant fails once; the next one opens
        # the new manifest.)
        self._close_connections()
        for name in self._cache_files():
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()
        shutil.rmtree(self.keyword_path.with_suffix(""), ignore_errors=True)
        self._keyword = None
        if not self.settings.collection:
            # a store built on a server before names were recorded keeps `papers`
            self.set_meta("collection", collection)

    # ---- keyword index ---------------------------------------------------------------------

    def last_rowid(self) -> int:
        """The newest committed chunk's rowid (-1 when none): rowids only grow, so this says whether
        the keyword index covers every chunk, in one index lookup (COUNT(*) would scan the table).
        """
        if not self.exists():
            return -1
        row = self._db().execute("SELECT MAX(rowid) FROM chunks").fetchone()
        return -1 if row[0] is None else int(row[0])

    def _rows_after(self, rowid: int):
        # Rows stream through the cursor: the chunk texts are never all in memory at once.
        return self._db().execute(
            "SELECT rowid, text FROM chunks WHERE rowid > ? ORDER BY rowid", (rowid,)
        )

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
            # Another stemmer's index (the store's was changed) is no index of these chunks' terms.
            fits = index.last_key <= self.last_rowid() and index.stemmer == self.keyword_stemmer()
            return index if fits else None
        return None

    def keyword_stemmer(self) -> str:
        """How this store's keyword index folds words (rag.text.KEYWORD_STEMMERS): recorded at its
        creation; light for stores built before it was recorded, and while there is no store."""
        try:
            recorded = self.meta("keyword_stemmer") if self.exists() else None
        except sqlite3.Error:
            recorded = None
        return recorded if recorded in KEYWORD_STEMMERS else "light"

    def use_keyword_stemmer(self, stemmer: str) -> bool:
        """Record another stemmer for an existing store (the caller holds the write lock), so that
        update_keyword_index rebuilds its keyword index with it; whether it changed."""
        if not self.exists() or self.keyword_stemmer() == stemmer:
            return False
        self.set_meta("keyword_stemmer", stemmer)
        return True

    def keyword_index_stale(self) -> bool:
        """The persisted keyword index is missing, unreadable, of an older format or another stemmer
        than the store's, or does not cover the committed chunks."""
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
        if (
            index is not None
            and len(index)
            != self._db()
            .execute("SELECT COUNT(*) FROM chunks WHERE rowid <= ?", (index.last_key,))
            .fetchone()[0]
        ):
            index = None  # it covers other chunks than these: start over
        segments = self.keyword_path.with_suffix("")
        try:
            index = index or KeywordIndex([], self.keyword_stemmer())
            if index.last_key < self.last_rowid():
                index = index.appended(self._rows_after(index.last_key), segments)
            index.save(self.keyword_path)
            # the single-file index of earlier versions
            with contextlib.suppress(FileNotFoundError):
                (self.dir / "keyword.npz").unlink()
        except OSError as exc:
            with contextlib.suppress(OSError):
                self.keyword_path.with_name(self.keyword_path.name + ".tmp").unlink()
            raise StoreError(
                f"could not write the keyword index in {self.dir} ({exc.strerror}); free disk space"
                " and run the ingest again"
            ) from None
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
                index = KeywordIndex([], self.keyword_stemmer())
            if index.last_key < last:
                index = index.appended(self._rows_after(index.last_key))
            self._keyword = index
            return index

    # ---- vectors (delegated to `vector_index`) ----------------------------------------------

    @property
    def server(self) -> ChromaServer | None:
        """The vectors when they are on a Chroma server (the corpus other stores share), else None:
        what only a server does (replicas, its state, sparse search) is reached through it."""
        return self.vector_index if isinstance(self.vector_index, ChromaServer) else None

    @property
    def sparse_unavailable(self) -> str | None:
        """Why the server's BM25 index is not used, if a query on it failed."""
        return self.server.sparse_unavailable if self.server is not None else None

    def collection(self):
        """The Chroma collection of the vectors (for tests and benches that look inside Chroma)."""
        if not isinstance(self.vector_index, ChromaVectors):
            kind = type(self.vector_index).__name__
            raise StoreError(f"the vectors of {self.dir} are not in Chroma ({kind})")
        return self.vector_index.collection()

    def vector_count(self) -> int:
        """How many vectors there are (orphans of a killed ingest, on a server other stores')."""
        return self.vector_index.count()

    def warm_vectors(self) -> None:
        """Load the vectors' search index in the background (a first question waits less)."""
        self.vector_index.warm()

    def dense_search(self, vector: list[float], n: int) -> list[tuple[int, float]] | None:
        """The best `n` committed chunks by cosine similarity: (rowid, similarity), best first;
        None when the vectors cannot be read here (embedded Chroma on a full disk or a read-only
        store: it must write to open), with the reason in `vectors_unavailable`."""
        if self.server is not None:
            self.vectors_unavailable = None  # a server that failed a question ago is asked again
        try:
            found = self.vector_index.search(vector, n)
        except VectorsUnwritable as exc:
            # Queries must not need to write: keyword retrieval still answers; callers say so.
            self.vectors_unavailable = str(exc)
            return None
        if not found and self.last_rowid() >= 0:
            # Chunks are committed but no vector (Chroma's directory deleted, a new server).
            fix = (
                f"run `{repair_command(self.dir)}` to push them back to the server"
                if self.server is not None
                else f"run `rag repair --store {self.dir}` to re-index them from papers.sqlite"
            )
            self.vectors_unavailable = (
                f"the vector store of {self.dir} holds no vectors for its "
                f"{self.chunk_count():,} chunks; {fix}"
            )
            return None
        rowids = self.rowids_for_chunk_ids([cid for cid, _ in found])
        if found and not rowids and self.server is not None and self.vectors_gone():
            self.vectors_unavailable = self.vectors_gone_message()
            return None
        # Orphan vectors of a killed ingest have no committed row: they are skipped.
        return [(rowids[cid], sim) for cid, sim in found if cid in rowids]

    def vectors(self, chunk_ids: list[str]) -> np.ndarray:
        """The chunks' vectors as a float32 matrix, one row per id in order."""
        import numpy as np

        ids, found = self.vector_index.fetch(chunk_ids)
        missing = set(chunk_ids) - set(ids)
        if missing:
            raise StoreError(
                f"{len(missing)} indexed chunks have no vector (e.g. {min(missing)}); "
                f"re-index them with `{repair_command(self.dir)}` (it keeps every "
                "paper)"
            )
        if not chunk_ids:
            return np.zeros((0, 0), np.float32)
        where = {cid: i for i, cid in enumerate(ids)}
        return found[[where[cid] for cid in chunk_ids]]

    def similarities(self, vector: list[float], chunk_ids: list[str]) -> dict[str, float]:
        """Cosine similarity of the vector to each of these chunks' vectors (those there are)."""
        import numpy as np

        if not chunk_ids or self.vectors_unavailable:
            return {}
        try:
            ids, m = self.vector_index.fetch(chunk_ids)
        except VectorsUnwritable as exc:
            self.vectors_unavailable = str(exc)
            return {}
        if not ids:
            return {}
        q = np.asarray(vector, dtype=np.float32)
        sims = m @ q / np.maximum(np.linalg.norm(m, axis=1) * np.linalg.norm(q), 1e-12)
        return dict(zip(ids, sims.tolist()))

    # ---- sharing a server ------------------------------------------------------------------

    def register_replica(self, embedding_model: str) -> None:
        """After an ingest on a server: name this store in its collection's metadata (so that a
        `--rebuild` by another store can tell it is not alone), and record in the manifest which
        collection its caches were built from. Nothing elsewhere."""
        if self.server is None:
            return
        collection_id = self.server.register(embedding_model)
        if self.exists():
            self.set_meta("server_collection", collection_id)

    def server_state(self) -> tuple[str, int] | None:
        """The collection's id and number of chunks on the server (None when it does not exist, or
        there is no server)."""
        return self.server.state() if self.server is not None else None

    def check_rebuild_alone(self) -> None:
        """Refuse a `--rebuild` that would delete other stores' vectors on a server."""
        if self.server is not None:  # embedded Chroma: one collection per store directory
            self.server.check_alone(self.chunk_count)

    def vectors_gone(self) -> bool:
        """Whether none of a sample of this store's chunks has its vector (on a server: another
        store rebuilt or replaced a shared collection)."""
        sample = self.sample_chunk_ids(20)
        if not sample:
            return False
        try:
            found, _ = self.vector_index.fetch(sample)
        except Exception:
            return False  # the query that follows reports what is wrong
        return not found

    def vectors_gone_message(self) -> str:
        return (
            f"the Chroma collection {self.collection_name!r} holds none of this store's "
            f"{self.chunk_count():,} chunks (another store rebuilt or replaced it); run "
            f"`{repair_command(self.dir)}` to push them back, or set RAG_COLLECTION to the "
            "collection holding them"
        )

    def server_keyword_search(self) -> bool:
        """Whether keyword retrieval runs on the server (its collection has a sparse index and no
        query has failed on it), rather than on the local BM25 cache."""
        return self.server is not None and self.server.keyword_search_ready()

    def sparse_search(self, query: str, n: int) -> list[tuple[int, float]] | None:
        """The best `n` committed chunks by the server's BM25 (rowid, score), best first; None when
        there is no server or it cannot run it (the reason in `sparse_unavailable`)."""
        found = self.server.sparse_search(query, n) if self.server is not None else None
        if found is None:
            return None
        rowids = self.rowids_for_chunk_ids([cid for cid, _ in found])
        return [(rowids[cid], score) for cid, score in found if cid in rowids]


def no_papers_on_server(collection: str) -> str:
    return (
        f"no papers yet in Chroma collection {collection!r}: a store on a server answers once an"
        " ingest into it (`rag ingest FILE` with the same RAG_CHROMA_URL and RAG_COLLECTION) has"
        " finished"
    )


class StoreDamaged(StoreError):
    """papers.sqlite cannot be read as it is (a damaged header or pages); `rag repair` keeps what it
    can."""


def damaged_manifest(store_dir: Path, exc: Exception) -> StoreDamaged:
    return StoreDamaged(
        f"the store's papers.sqlite in {store_dir} is damaged ({short_error(exc)}); run "
        f"`{repair_command(store_dir)}` to re-index every paper it still holds (the damaged files "
        "are kept)"
    )


# SQLite's primary result codes for a damaged file: SQLITE_CORRUPT ("database disk image is
# malformed") and SQLITE_NOTADB ("file is not a database", e.g. a damaged header).
_CORRUPTION_CODES = (11, 26)


def _is_corruption(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and code is not None
        and code & 0xFF in _CORRUPTION_CODES
    )


class _Cursor(sqlite3.Cursor):
    """A cursor whose reads of a damaged page (which may come mid-iteration) raise StoreDamaged,
    naming the fix, instead of sqlite3.DatabaseError: every caller of the store then gets one line,
    not a traceback."""

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
    """The manifest's connection, giving `_Cursor`s (sqlite3.Connection.execute makes its cursor in
    C, so a subclass cannot)."""

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
