"""`rag repair`: re-index a store from what it still holds, keeping every paper that can be read.

Not `rag ingest --rebuild`, which empties the store and needs the source files: the manifest
(`papers.sqlite`) holds every paper's metadata and abstract, so chunks and vectors can be made again
from it alone. Under the write lock: salvage the manifest from a copy (reading past garbled pages,
keeping only abstracts that still match their hash), index it into a new store beside the old one,
then swap them, keeping the damaged files and the ids of the papers lost in `damaged-<time>/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rag.errors import StoreError
from rag.index.chunking import abstract_hash
from rag.index.corpus import Paper, Record, derive_label
from rag.index.ingest import Plan
from rag.index.store import Store
from rag.index.vectors import chroma_paper_ids, forget_chroma_clients
from rag.models import IngestReport

_MAGIC = b"SQLite format 3\x00"
_RANGE = 2048  # rowids per read: a garbled page costs at most this range's halving
# Store files a repair replaces; what it moves aside (the damaged files, kept for the user).
_BUILT = (
    "papers.sqlite",
    "papers.sqlite-wal",
    "papers.sqlite-shm",
    "chroma",
    "keyword.json",
    "keyword",
)
_ASIDE = (*_BUILT, "keyword.npz", "map.npz")


@dataclass
class Salvage:
    """What could be read from a manifest."""

    meta: dict[str, str] = field(default_factory=dict)
    papers: dict[str, Paper] = field(default_factory=dict)
    # (paper id, abstract), in rowid order
    abstracts: list[tuple[str, str]] = field(default_factory=list)
    # read from chunk texts, for papers whose row is lost
    titles: dict[str, str] = field(default_factory=dict)
    seen_ids: set[str] = field(default_factory=set)  # every paper id a readable row names
    # rowids in ranges that could not be read (gaps included: an upper bound)
    unreadable_rows: int = 0
    garbled_abstracts: int = 0  # abstracts whose text no longer matches their stored hash
    header_rewritten: bool = False
    intact: bool = False  # SQLite's quick_check found nothing wrong
    error: str | None = None  # why nothing at all could be read

    @property
    def damaged(self) -> bool:
        return (
            not self.intact
            or self.header_rewritten
            or bool(self.unreadable_rows or self.garbled_abstracts)
        )


@dataclass
class RepairReport:
    store: str
    manifest_damaged: bool
    papers_kept: int = 0
    abstracts_kept: int = 0
    # papers back whose own row was unreadable: authors, url, venue, year unknown
    without_metadata: int = 0
    chunks: int = 0
    lost: list[str] = field(default_factory=list)
    salvage: Salvage = field(default_factory=Salvage)
    aside: str | None = None
    lost_file: str | None = None

    def summary(self) -> str:
        s = self.salvage
        lines = [
            f"re-indexed {self.papers_kept:,} papers ({self.abstracts_kept:,} abstracts,"
            f" {self.chunks:,} chunks) from what {self.store} held"
        ]
        if s.header_rewritten:
            lines.append("papers.sqlite had a damaged header: read through a repaired copy")
        if s.unreadable_rows:
            lines.append(f"{s.unreadable_rows:,} row positions of papers.sqlite could not be read")
        if s.garbled_abstracts:
            lines.append(f"{s.garbled_abstracts:,} abstracts were garbled and not re-indexed")
        if self.without_metadata:
            lines.append(
                f"{self.without_metadata:,} papers came back without their authors, url, venue and"
                " year (their rows were unreadable; titles were read from their chunks);"
                " re-ingesting their files fills them in"
            )
        if s.error:
            lines.append(
                f"papers.sqlite could not be read at all ({s.error}): it alone holds the abstracts "
                "(Chroma keeps only ids and vectors)"
            )
        if self.lost:
            lines.append(
                f"{len(self.lost):,} papers could not be recovered (ids in {self.lost_file});"
                f" re-ingest their files with `rag ingest FILE... --store {self.store}` (papers"
                " already there are skipped)"
            )
        if self.aside:
            lines.append(
                f"the previous files are kept in {self.aside} (delete it once you are satisfied)"
            )
        return "\n".join(lines)


# ---- salvage ---------------------------------------------------------------------------------


def _standard_header(head: bytes, size: int, wal: bool) -> bytes:
    """The first 24 bytes of the header rewritten to SQLite's standard values; the page size kept
    when it is a valid one that divides the file, else 4096 (the default). The rest (page count,
    schema cookie...) SQLite re-derives or tolerates."""
    out = bytearray(head)
    out[:16] = _MAGIC
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    if not (512 <= page <= 65536 and page & (page - 1) == 0 and size % page == 0):
        page = 4096
    out[16:18] = (1 if page == 65536 else page).to_bytes(2, "big")
    out[18] = out[19] = 2 if wal else 1  # file format: 2 = WAL
    out[20], out[21], out[22], out[23] = 0, 64, 32, 32  # reserved bytes, payload fractions
    return bytes(out)


def _open_copy(db_path: Path, workdir: Path, salvage: Salvage) -> sqlite3.Connection | None:
    """A connection to a copy of the manifest (with its WAL: committed rows may live only there),
    header rewritten when SQLite refuses it; None when nothing can be opened."""
    copy = workdir / "salvage.sqlite"
    shutil.copyfile(db_path, copy)
    wal = db_path.with_name(db_path.name + "-wal")
    has_wal = wal.exists() and wal.stat().st_size > 0
    if has_wal:
        shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
    for attempt in range(2):
        conn = sqlite3.connect(copy, isolation_level=None)
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.DatabaseError as exc:
            conn.close()
            salvage.error = str(exc)
            if attempt or copy.stat().st_size < 100:
                return None
            with open(copy, "r+b") as fh:
                head = fh.read(100)
                fh.seek(0)
                fh.write(_standard_header(head, copy.stat().st_size, has_wal))
            salvage.header_rewritten = True
    return None


def _read_range(
    conn: sqlite3.Connection, sql: str, lo: int, hi: int, salvage: Salvage
) -> Iterator[tuple]:
    """Rows with rowid in [lo, hi]; a range that hits a damaged page is halved until the unreadable
    rowids are isolated (and counted)."""
    try:
        rows = conn.execute(sql, (lo, hi)).fetchall()
    except sqlite3.DatabaseError:
        if lo == hi:
            salvage.unreadable_rows += 1
            return
        mid = (lo + hi) // 2
        yield from _read_range(conn, sql, lo, mid, salvage)
        yield from _read_range(conn, sql, mid + 1, hi, salvage)
        return
    yield from rows


def _max_rowid(conn: sqlite3.Connection, table: str, file_size: int) -> int:
    with contextlib.suppress(sqlite3.DatabaseError):
        row = conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()
        return int(row[0] or 0)
    with contextlib.suppress(sqlite3.DatabaseError, TypeError):
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name=?", (table,)).fetchone()
        return int(row[0])
    return max(1, file_size // 32)  # no row is smaller than this: an upper bound to scan up to


def _table_rows(
    conn: sqlite3.Connection, table: str, columns: str, file_size: int, salvage: Salvage
) -> Iterator[tuple]:
    try:
        conn.execute(f"SELECT {columns} FROM {table} LIMIT 0")
    except sqlite3.DatabaseError:  # the table's schema row is unreadable
        return
    sql = f"SELECT {columns} FROM {table} WHERE rowid BETWEEN ? AND ? ORDER BY rowid"
    top = _max_rowid(conn, table, file_size)
    for lo in range(1, top + 1, _RANGE):
        yield from _read_range(conn, sql, lo, min(lo + _RANGE - 1, top), salvage)


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite's variable-length integer at `i`: (value, next offset)."""
    value = 0
    for n in range(9):
        byte = buf[i + n]
        if n == 8:
            return (value << 8) | byte, i + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, i + n + 1
    raise ValueError("varint")


def _record(payload: bytes) -> list:
    """The column values of a record (SQLite's record format)."""
    size, i = _varint(payload, 0)
    types, body = [], size
    while i < size:
        t, i = _varint(payload, i)
        types.append(t)
    out: list = []
    for t in types:
        if t == 0:
            out.append(None)
        elif t in (8, 9):
            out.append(t - 8)
        elif t <= 6:
            width = (0, 1, 2, 3, 4, 6, 8)[t]
            out.append(int.from_bytes(payload[body : body + width], "big", signed=True))
            body += width
        elif t == 7:
            body += 8
            out.append(None)  # no float column holds anything a repair needs
        elif t >= 12:
            width = (t - 12) // 2
            chunk = payload[body : body + width]
            if len(chunk) != width:
                raise ValueError("short record")
            out.append(chunk.decode("utf-8") if t % 2 else bytes(chunk))
            body += width
        else:
            raise ValueError("serial type")
    return out


def scan_pages(db_file: Path) -> Iterator[tuple[int, list]]:
    """(rowid, values) of every cell on every table-leaf page of a SQLite file, read page by page
    without SQLite's b-tree: rows under a garbled interior page (which SQL can no longer reach) are
    found too. Cells that do not parse are skipped; callers check what they get (an abstract against
    its hash)."""
    data = db_file.read_bytes()
    if len(data) < 512:
        return
    page = int.from_bytes(data[16:18], "big")
    page = 65536 if page == 1 else page
    if not (512 <= page <= 65536 and page & (page - 1) == 0):
        page = 4096
    usable = page - data[20] if data[20] < 64 else page
    pages = len(data) // page

    def overflow(first: int, need: int) -> bytes:
        out, seen = bytearray(), set()
        while first and len(out) < need and first not in seen and 1 <= first <= pages:
            seen.add(first)
            start = (first - 1) * page
            out += data[start + 4 : start + usable]
            first = int.from_bytes(data[start : start + 4], "big")
        if len(out) < need:
            raise ValueError("overflow chain")
        return bytes(out[:need])

    for number in range(1, pages + 1):
        base = (number - 1) * page
        head = base + (100 if number == 1 else 0)
        if data[head] != 0x0D:  # not a table leaf
            continue
        cells = int.from_bytes(data[head + 3 : head + 5], "big")
        for c in range(min(cells, usable // 4)):
            try:
                at = base + int.from_bytes(data[head + 8 + 2 * c : head + 10 + 2 * c], "big")
                size, i = _varint(data, at)
                rowid, i = _varint(data, i)
                biggest = usable - 35
                if size <= biggest:
                    payload = data[i : i + size]
                else:
                    least = (usable - 12) * 32 // 255 - 23
                    local = least + (size - least) % (usable - 4)
                    local = local if local <= biggest else least
                    payload = data[i : i + local] + overflow(
                        int.from_bytes(data[i + local : i + local + 4], "big"), size - local
                    )
                yield rowid, _record(payload)
            except (ValueError, IndexError, UnicodeDecodeError, RecursionError):
                continue


def _paper_row(values: list) -> Paper | None:
    if len(values) != 7 or not isinstance(values[0], str) or not values[0]:
        return None
    if not all(v is None or isinstance(v, str) for v in values) or not isinstance(values[3], str):
        return None
    try:
        names = json.loads(values[3])
    except ValueError:
        return None
    if not isinstance(names, list):
        return None
    return Paper(
        values[0],
        values[1] or "",
        values[2] or "",
        [a for a in names if isinstance(a, str)],
        values[4],
        values[5],
        values[6],
    )


def salvage_manifest(db_path: Path, workdir: Path) -> Salvage:
    """Everything that can still be read from `db_path` (never written to)."""
    salvage = Salvage()
    if not db_path.exists():
        salvage.error = "no papers.sqlite"
        return salvage
    conn = _open_copy(db_path, workdir, salvage)
    if conn is None:
        return salvage
    salvage.error = None
    size = db_path.stat().st_size
    with contextlib.closing(conn):
        with contextlib.suppress(sqlite3.DatabaseError):
            salvage.intact = conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        with contextlib.suppress(sqlite3.DatabaseError):
            salvage.meta = {str(k): str(v) for k, v in conn.execute("SELECT key, value FROM meta")}
        for pid, title, label, authors, url, venue, year in _table_rows(
            conn, "papers", "paper_id, title, label, authors, url, venue, year", size, salvage
        ):
            if not isinstance(pid, str) or not pid:
                continue
            try:
                names = json.loads(authors)
                names = [a for a in names if isinstance(a, str)] if isinstance(names, list) else []
            except (TypeError, ValueError):
                names = []
            salvage.papers[pid] = Paper(
                pid,
                title if isinstance(title, str) else "",
                label if isinstance(label, str) else "",
                names,
                *(v if isinstance(v, str) else None for v in (url, venue, year)),
            )
            salvage.seen_ids.add(pid)
        done: set[tuple[str, str]] = set()
        garbled: set[tuple[str, str]] = set()
        for pid, ahash, abstract, text in _table_rows(
            conn, "chunks", "paper_id, abstract_hash, abstract, text", size, salvage
        ):
            _note_title(salvage, pid, abstract, text)
            if not isinstance(pid, str) or not isinstance(ahash, str):
                continue
            salvage.seen_ids.add(pid)
            key = (pid, ahash)
            if key in done:
                continue
            # Each chunk row carries its whole abstract: any one that still hashes right will do.
            if isinstance(abstract, str) and abstract_hash(abstract) == ahash:
                done.add(key)
                garbled.discard(key)
                salvage.abstracts.append((pid, abstract))
            else:
                garbled.add(key)
        # SQL reaches rows through the b-tree: a garbled interior page hides every row under it. The
        # file's leaf pages are scanned too (as sqlite3's `.recover` does), for rows SQL could not
        # reach.
        with contextlib.suppress(sqlite3.DatabaseError):
            # the WAL's committed pages into the copy
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        found: list[tuple[int, str, str]] = []
        for rowid, values in scan_pages(workdir / "salvage.sqlite"):
            paper = _paper_row(values)
            if paper is not None:
                salvage.seen_ids.add(paper.paper_id)
                salvage.papers.setdefault(paper.paper_id, paper)
            elif (
                len(values) == 7
                and values[0] is None
                and all(isinstance(v, str) for v in values[1:4])
            ):
                pid, ahash, abstract = values[2], values[3], values[6]
                _note_title(salvage, pid, abstract, values[5])
                salvage.seen_ids.add(pid)
                key = (pid, ahash)
                if key not in done:
                    if isinstance(abstract, str) and abstract_hash(abstract) == ahash:
                        done.add(key)
                        garbled.discard(key)
                        found.append((rowid, pid, abstract))
                    else:
                        garbled.add(key)
        salvage.abstracts.extend((pid, abstract) for _, pid, abstract in sorted(found))
        salvage.garbled_abstracts = len(garbled)
    if (
        not salvage.abstracts
        and not salvage.papers
        and salvage.error is None
        and salvage.unreadable_rows
    ):
        salvage.error = "no row could be read"
    return salvage


def _note_title(salvage: Salvage, pid, abstract, text) -> None:
    """A chunk's text is its paper's title (or label), a line break, then a piece of the abstract:
    the title of a paper whose own row is unreadable can be read from its first chunk."""
    if pid in salvage.titles or not all(isinstance(v, str) for v in (pid, abstract, text)):
        return
    head, sep, rest = text.partition("\n")
    if sep and rest[:40] in abstract and head.strip() and head != derive_label(abstract):
        salvage.titles[pid] = head.strip()


def _records(salvage: Salvage) -> Iterator[Record]:
    for pid, abstract in salvage.abstracts:
        paper = salvage.papers.get(pid) or Paper(
            pid, salvage.titles.get(pid, ""), derive_label(abstract)
        )
        yield Record(
            paper.paper_id,
            paper.title,
            paper.label or ("" if paper.title else derive_label(abstract)),
            list(paper.authors),
            paper.url,
            paper.venue,
            paper.year,
            abstract=abstract,
            source=f"papers.sqlite ({pid})",
        )


class _SalvagedPlan(Plan):
    """An ingest plan over salvaged abstracts instead of files."""

    def __init__(self, salvage: Salvage) -> None:
        super().__init__([], IngestReport())
        self.salvage = salvage
        self.todo = {(pid, abstract_hash(abstract)): True for pid, abstract in salvage.abstracts}

    def records(self) -> Iterator[tuple[Record, str, bool]]:
        for rec in _records(self.salvage):
            yield rec, abstract_hash(rec.abstract), True


def _move(src: Path, dest: Path) -> None:
    if src.exists() or src.is_symlink():
        os.replace(src, dest)


@dataclass
class PushReport:
    """What `rag repair` did on a store whose vectors are on a Chroma server."""

    store: str
    collection: str
    papers: int
    chunks: int

    def summary(self) -> str:
        if not self.chunks:
            return (
                f"Chroma collection {self.collection!r} holds every paper of {self.store}:"
                " nothing to push back"
            )
        return (
            f"pushed {self.papers:,} papers ({self.chunks:,} chunks) of {self.store} back to"
            f" Chroma collection {self.collection!r}"
        )


def push_to_server(rag, progress: bool = False) -> PushReport:
    """`rag repair` with RAG_CHROMA_URL: the server is the corpus and this store holds caches of
    it, so the repair goes the other way: every abstract of this store that the server lacks (it
    lost its collection, or a chunk) is embedded again and written back (rag/index/replica.py)."""
    from rag.index.replica import push_back

    store = rag.store
    if not store.exists() or store.last_rowid() < 0:
        raise StoreError(
            f"there are no papers in {store.dir} to push back to the server; build the index with"
            f" `rag ingest FILE... --store {store.dir}`"
        )
    with rag._lock, store.writer():
        store.check_home()
        store.check_compatible(rag.embedder.model_id)
        papers, chunks = push_back(store, rag.embedder, progress)
    return PushReport(str(store.dir), store.collection_name, papers, chunks)


def repair(rag, progress: bool = False) -> RepairReport | PushReport:
    """Re-index `rag`'s store from what it still holds (see the module docstring)."""
    from rag.backends.embedders import (
        MINILM_MAX_TOKENS,
        ingest_embedder,
        known_model,
        make_embedder,
    )
    from rag.index.ingest import index_records

    settings = rag.settings
    if settings.chroma_url:
        return push_to_server(rag, progress)
    old = rag.store
    if not old.exists():
        old.check_readable()
        raise StoreError(
            f"there is no papers.sqlite in {old.dir}: nothing to repair; build the index with "
            f"`rag ingest FILE... --store {old.dir}`"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = old.dir / f".repair-{stamp}"
    with rag._lock, old.writer():
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            salvage = salvage_manifest(old.db_path, work)
            in_chroma, vectors_readable = chroma_paper_ids(old.dir, old.collection_name)
            known = salvage.seen_ids | in_chroma
            damaged = salvage.damaged or not vectors_readable
            report = RepairReport(str(old.dir), salvage.damaged, salvage=salvage)
            kept = {pid for pid, _ in salvage.abstracts}
            report.lost = sorted(known - kept)
            # The model the store was built with, unless one is set explicitly (a repair then
            # re-embeds every abstract with it: a way to change models that keeps the papers).
            built_with = salvage.meta.get("embedding_model")
            embedder = rag.embedder
            if (
                built_with
                and "embed_model" not in settings.model_fields_set
                and built_with != settings.embed_model
                and known_model(built_with)
            ):
                settings = settings.model_copy(update={"embed_model": built_with})
                embedder = make_embedder(settings)
            new = Store(settings.model_copy(update={"store_dir": work / "store"}))
            plan = _SalvagedPlan(salvage)
            if salvage.abstracts:
                chosen = ingest_embedder(settings, embedder, len(plan))
                max_tokens = getattr(chosen, "max_tokens", None) or MINILM_MAX_TOKENS
                with new.writer():
                    done = index_records(
                        new,
                        chosen,
                        plan,
                        settings.chunk_size,
                        settings.chunk_overlap,
                        max_tokens,
                        progress,
                    )
                    if salvage.meta.get("corpus_pending"):
                        new.set_meta("corpus_pending", salvage.meta["corpus_pending"])
                report.chunks = done.new_chunks
                report.abstracts_kept = len(salvage.abstracts)
                report.papers_kept = len(kept)
                report.without_metadata = len(kept - set(salvage.papers))
            elif not damaged:
                raise StoreError(f"{old.dir} holds no papers: nothing to repair")
            # Swap: the old files aside (kept), the new ones in. Chroma's clients let go of both
            # first.
            new.close()
            old.close()
            forget_chroma_clients()
            aside = old.dir / f"damaged-{stamp}" if damaged else old.dir / f"before-repair-{stamp}"
            aside.mkdir()
            for name in _ASIDE:
                _move(old.dir / name, aside / name)
            for name in _BUILT:
                _move(new.dir / name, old.dir / name)
            report.aside = str(aside)
            if report.lost:
                lost_file = aside / "lost-papers.txt"
                lost_file.write_text("".join(f"{pid}\n" for pid in report.lost), encoding="utf-8")
                report.lost_file = str(lost_file)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    rag.store = Store(rag.settings)
    return report
