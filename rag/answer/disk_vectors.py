"""The sentence scorer's vectors of source texts, kept on disk across processes.

Each `rag ask` is a new process, and before the model reads (or the quotes are chosen) it embeds
the five papers' abstracts and every sentence of them with the sentence scorer: ~0.9 s on two idle
AVX2 cores, ~1.7 s on busy ones (`python -m bench.speed.answer_embeddings`). The same papers come
back across questions, so their vectors are kept in one SQLite file
(`model_cache_dir/answer-vectors/vectors.sqlite`), keyed by a hash of the model's identity and the
text; a row holds the vector's bytes and their CRC32. Only the bundled ONNX models are kept: their
vectors do not depend on the batch they were computed in (checked on 120 sentences). At most
`MAX_ROWS` (~80 MB), the oldest dropped first. Anything that fails (a read-only or full disk, a
damaged file or row) leaves the answer as it would be without it: the vectors are computed instead.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import zlib
from pathlib import Path
from typing import Any

MAX_ROWS = 50_000
_KINDS = {b"f": "<f4", b"d": "<f8"}  # float32 when that holds the vector exactly, else float64


class DiskVectors:
    """Vectors of texts under one model's `identity`, in the SQLite file at `path`."""

    def __init__(self, path: Path, identity: str, max_rows: int = MAX_ROWS) -> None:
        self.path, self.identity, self.max_rows = path, identity, max_rows
        self._db: sqlite3.Connection | None = None
        self._off = False
        self._lock = threading.Lock()

    def get(self, texts: list[str]) -> dict[str, Any]:
        """The kept vector of each text that has one (numpy arrays)."""
        import numpy as np

        keys = {self._key(t): t for t in texts}
        wanted = list(keys)

        def read(db: sqlite3.Connection) -> list[tuple[bytes, bytes]]:
            rows = []
            for i in range(0, len(wanted), 500):  # under SQLite's limit of bound values
                part = wanted[i : i + 500]
                marks = ",".join("?" * len(part))
                query = f"SELECT key, vector FROM vectors WHERE key IN ({marks})"
                rows += db.execute(query, part).fetchall()
            return rows

        found = {}
        for key, blob in self._run(read) or []:
            kind, crc, data = bytes(blob[:1]), bytes(blob[1:5]), bytes(blob[5:])
            dtype = _KINDS.get(kind)
            if (
                dtype is None
                or not data
                or len(data) % np.dtype(dtype).itemsize
                or zlib.crc32(data).to_bytes(4, "big") != crc
            ):
                continue  # damaged: computed again (and rewritten)
            found[keys[key]] = np.frombuffer(data, dtype=dtype)
        return found

    def put(self, vectors: dict[str, Any]) -> None:
        """Keep these vectors (numpy arrays of float32 or float64), dropping the oldest rows past
        `max_rows`."""
        rows = []
        for text, vector in vectors.items():
            kind = b"f" if vector.dtype.itemsize == 4 else b"d"
            data = vector.astype(_KINDS[kind]).tobytes()
            rows.append((self._key(text), kind + zlib.crc32(data).to_bytes(4, "big") + data))

        def write(db: sqlite3.Connection) -> None:
            with db:
                db.executemany("INSERT OR REPLACE INTO vectors (key, vector) VALUES (?, ?)", rows)
                (count,) = db.execute("SELECT count(*) FROM vectors").fetchone()
                if count > self.max_rows:
                    db.execute(
                        "DELETE FROM vectors WHERE rowid IN"
                        " (SELECT rowid FROM vectors ORDER BY rowid LIMIT ?)",
                        (count - self.max_rows,),
                    )

        if rows:
            self._run(write)

    def _key(self, text: str) -> bytes:
        data = f"{self.identity}\0{text}".encode("utf-8", "surrogatepass")
        return hashlib.sha256(data).digest()[:16]

    def _run(self, work: Any) -> Any:
        """`work(connection)`, or None when the file cannot be used (then never again here) or
        another process holds it past the timeout."""
        with self._lock:
            if self._off:
                return None
            try:
                if self._db is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    db = sqlite3.connect(self.path, timeout=2.0, check_same_thread=False)
                    db.execute("PRAGMA journal_mode=WAL")
                    db.execute(
                        "CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB)"
                    )
                    self._db = db
                return work(self._db)
            except sqlite3.OperationalError as exc:
                # another process writing past the timeout: skipped this time, not for good
                self._off = "locked" not in str(exc) and "busy" not in str(exc)
                return None
            except (sqlite3.Error, OSError, ValueError):
                self._off = True
                return None


def disk_vectors(embedder: Any, cache_dir: Path) -> DiskVectors | None:
    """The kept vectors of `embedder` under `cache_dir`, when it is a bundled ONNX model; else
    None. Keyed by the model's id, its file's size and time, and the CPU's kind of int8 products
    (a home directory shared by machines whose kernels round differently keeps each one's own)."""
    import platform

    from rag.backends.embedders.int8_products import exact_products
    from rag.backends.embedders.onnx import OnnxMiniLM

    if type(embedder) is not OnnxMiniLM or embedder.files is not None:
        return None
    try:
        stat = embedder.model_files()[0].stat()
    except Exception:  # noqa: BLE001 - a missing model says so when it is loaded, not here
        return None
    identity = (
        f"{embedder.model_id}|{stat.st_size}|{stat.st_mtime_ns}|{platform.machine()}"
        f"|exact={exact_products()}"
    )
    return DiskVectors(cache_dir / "answer-vectors" / "vectors.sqlite", identity)
