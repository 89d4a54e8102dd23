"""Bounded reading of corpus files: every read is bounded while it happens, so a `.jsonl` linked to
/dev/zero or a gzip bomb ends in one line (`file:line: what is wrong`), not in a full memory.

`ReadLimits` says how much is read; `open_text` (a file whole) and `text_lines` (a block at a time)
read through `_LimitedReader` and raise errors that name the file and the fix. `rag.index.corpus`
parses what they read.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rag.errors import CorpusError


@dataclass(frozen=True)
class ReadLimits:
    """How much of a corpus file is read before it is refused (see the module docstring).

    - `record_bytes`: one JSONL line, one CSV record (all its lines) or one line of a seed file;
      the longest line of a 2.3M-line paper dump is 16.8 KB.
    - `document_bytes`: a `.json` document or a seed `.txt` file, read whole.
    - `gzip_ratio`, `gzip_floor_bytes`: a `.gz` file may decompress to `gzip_ratio` times its
      size, or `gzip_floor_bytes` if more; paper dumps compress 3-3.5x, 3 GB of spaces ~1,000x.
    """

    record_bytes: int = 4 * 2**20
    document_bytes: int = 128 * 2**20
    gzip_ratio: int = 50
    gzip_floor_bytes: int = 16 * 2**20


DEFAULT_LIMITS = ReadLimits()


def _read_error(path: Path, exc: OSError) -> CorpusError:
    if isinstance(exc, FileNotFoundError):
        return CorpusError(f"{path}: no such file; check the path")
    if isinstance(exc, IsADirectoryError):
        return CorpusError(f"{path}: is a directory; pass the files inside it")
    return CorpusError(f"{path}: cannot read ({exc.strerror}); check its permissions")


def _gzip_error(path: Path, exc: Exception) -> CorpusError:
    return CorpusError(f"{path}: not a valid gzip file ({exc}); re-download or re-compress it")


def _utf8_error(path: Path, byte: int, line: int) -> CorpusError:
    return CorpusError(
        f"{path}: not UTF-8 text (byte {byte}, line {line}); convert it with e.g. `iconv -t UTF-8`"
    )


def _binary_error(path: Path) -> CorpusError:
    return CorpusError(f"{path}: looks like a binary file, not JSONL, CSV or text")


class _LimitedReader:
    """A corpus file opened for bounded reading: lines of at most `limit` bytes, and for `.gz` a
    total decompressed size checked against the compressed size as it is read (never after)."""

    def __init__(self, path: Path, limits: ReadLimits) -> None:
        self.path, self.limits = path, limits
        self.gzipped = path.name.lower().endswith(".gz")
        try:
            self._raw = open(path, "rb")
        except OSError as exc:
            raise _read_error(path, exc) from None
        self.allowed: int | None = None
        self.compressed = 0
        if self.gzipped:
            st = os.fstat(self._raw.fileno())
            # A device or a pipe has no size: only the floor applies (the gzip header check comes
            # first).
            self.compressed = st.st_size if stat.S_ISREG(st.st_mode) else 0
            self.allowed = max(limits.gzip_floor_bytes, limits.gzip_ratio * self.compressed)
        self._fh = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzipped else self._raw
        self.total = 0

    def __enter__(self) -> _LimitedReader:
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError, EOFError, gzip.BadGzipFile):
            self._fh.close()
        self._raw.close()

    def _call(self, method, size: int) -> bytes:
        try:
            data = method(size)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise _gzip_error(self.path, exc) from None
        except OSError as exc:
            raise (
                _gzip_error(self.path, exc) if self.gzipped else _read_error(self.path, exc)
            ) from None
        self.total += len(data)
        if self.allowed is not None and self.total > self.allowed:
            raise CorpusError(
                f"{self.path}: decompresses to more than {self.allowed:,} bytes,"
                f" {self.limits.gzip_ratio}x its compressed size of {self.compressed:,} bytes (the"
                " limit for a .gz file; paper dumps compress about 3x): check that it is the file"
                " you meant, not a gzip bomb; to ingest it anyway, decompress it and pass the"
                " plain file"
            )
        return data

    def readline(self, size: int) -> bytes:
        return self._call(self._fh.readline, size)

    def read(self, size: int) -> bytes:
        return self._call(self._fh.read, size)


def line_limit_error(path: Path, lineno: int, limits: ReadLimits, what: str) -> CorpusError:
    return CorpusError(
        f"{path}:{lineno}: {what} longer than {limits.record_bytes:,} bytes (the limit for one"
        " record); check that the file holds one record per line (not a binary file or a device"
        " such as /dev/zero), or shorten or remove that record"
    )


def open_text(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> str:
    """A whole file as text (a `.json` document, a seed `.txt`), read up to
    `limits.document_bytes`."""
    with _LimitedReader(path, limits) as reader:
        data = reader.read(limits.document_bytes + 1)
    if len(data) > limits.document_bytes:
        raise CorpusError(
            f"{path}: longer than {limits.document_bytes:,} bytes (the limit for a file read whole:"
            " .json and seed .txt); convert it to JSONL (one record per line: `jq -c '.[]' FILE >"
            " FILE.jsonl`), which is read a line at a time, or split it"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _utf8_error(path, exc.start, data.count(b"\n", 0, exc.start) + 1) from None
    if "\x00" in text:
        raise _binary_error(path)
    return text.lstrip("\ufeff")


class RecordBudget:
    """Bytes read since the last record began, and the line it began on: a CSV record may span lines
    (a quoted line break), and the reader pulls lines until its record ends, so the budget is
    checked per line and reset per record."""

    def __init__(self) -> None:
        self.used, self.first, self.fresh = 0, 1, True

    def reset(self) -> None:
        self.used, self.fresh = 0, True


_BLOCK_BYTES = 2**20


def text_lines(
    path: Path,
    limits: ReadLimits = DEFAULT_LIMITS,
    budget: RecordBudget | None = None,
    skip_blank: bool = False,
) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file's lines, read a block at a time, each line at most
    `limits.record_bytes` (checked as the blocks arrive: a line is never held whole before it is
    refused), so a 100k-record dump is never in memory whole. Split on newlines only
    (str.splitlines() also splits at U+2028/U+2029/U+0085 inside strings); errors as `open_text`
    words them. With `budget`, the bytes of all lines since its last reset count against the limit
    (a multi-line CSV record). `skip_blank` counts blank lines without yielding them: a gzip of
    newlines then costs a C-speed split, not a Python step per line, until the ratio check stops it.
    """
    offset = 0  # bytes before the current line, for the UTF-8 error's position
    lineno = 0
    tail = b""  # the start of a line whose end has not been read yet
    what = "record" if budget is not None else "line"
    with _LimitedReader(path, limits) as reader:
        while True:
            block = reader.read(_BLOCK_BYTES)
            if not block:
                parts = [tail] if tail else []
            elif (tail + block).isspace():
                # Only blank lines (a gzip of newlines): counted in C, not stepped through.
                run = tail + block
                tail = run[run.rfind(b"\n") + 1 :]
                newlines = run.count(b"\n")
                lineno += newlines
                offset += len(run) - len(tail)
                if len(tail) > limits.record_bytes:
                    raise line_limit_error(path, lineno + 1, limits, what)
                # one line break stands for the run (CSV: a blank row)
                if newlines and not skip_blank:
                    if budget is not None and budget.fresh:
                        budget.first, budget.fresh = lineno, False
                    yield lineno, "\n"
                continue
            else:
                parts = (tail + block).split(b"\n")
                tail = parts.pop()
                if (
                    len(tail) + (0 if budget is None or budget.fresh or parts else budget.used)
                    > limits.record_bytes
                ):
                    at = (
                        budget.first
                        if budget is not None and not budget.fresh and not parts
                        else lineno + len(parts) + 1
                    )
                    raise line_limit_error(path, at, limits, what)
            last = len(parts) - 1
            for i, raw in enumerate(parts):
                lineno += 1
                newline = b"\n" if block or i < last else b""
                if skip_blank and not raw.strip():
                    offset += len(raw) + len(newline)
                    continue
                length = len(raw)
                if budget is not None:
                    if budget.fresh:
                        budget.first, budget.fresh = lineno, False
                    budget.used += length
                    length = budget.used
                if length > limits.record_bytes:  # a CSV record: named by its first line
                    raise line_limit_error(
                        path, budget.first if budget is not None else lineno, limits, what
                    )
                try:
                    line = (raw + newline).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _utf8_error(path, offset + exc.start, lineno) from None
                offset += len(raw) + len(newline)
                if "\x00" in line:
                    raise _binary_error(path)
                yield lineno, (line.lstrip("\ufeff") if lineno == 1 else line)
            if not block:
                return
