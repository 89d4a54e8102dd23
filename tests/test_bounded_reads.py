"""Every ingest read is bounded while it happens (issue 31, item 3): a record (a JSONL line, a
CSV record over any number of lines), a whole `.json`/seed document, and a `.gz` file's
decompressed size against its compressed size. Small limits are passed as `ReadLimits` so the
tests are quick; the CLI tests use the defaults on real devices and real gzip files
(bench/speed/bounded_reads.py measures the memory at full size)."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from rag.errors import CorpusError
from rag.index.corpus import iter_records, parse_file
from rag.index.reading import DEFAULT_LIMITS, ReadLimits

SMALL = ReadLimits(
    record_bytes=1_000, document_bytes=50_000, gzip_ratio=20, gzip_floor_bytes=100_000
)


def _record(
    i: int, abstract: str = "We study attention in small models and report results."
) -> str:
    return json.dumps({"id": f"p{i}", "title": f"Paper {i}", "abstract": abstract})


def _read_all(path: Path, limits: ReadLimits = SMALL) -> list:
    return list(iter_records(path, limits))


def test_a_jsonl_line_over_the_limit_is_refused_naming_the_limit(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(_record(1) + "\n" + _record(2, "x" * 5_000) + "\n")
    with pytest.raises(CorpusError) as err:
        _read_all(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:2: line longer than 1,000 bytes (the limit for one record)")
    assert "\n" not in msg and "one record per line" in msg
    # Under the limit, the same file reads.
    assert len(_read_all(path, ReadLimits(record_bytes=10_000))) == 2


def test_dev_zero_as_jsonl_stops_at_the_limit_without_reading_on(tmp_path):
    """/dev/zero never ends: the read must stop at the limit, holding a few blocks at most."""
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    limits = ReadLimits(record_bytes=256 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(CorpusError, match=r"zero\.jsonl:1: line longer than 262,144 bytes"):
            _read_all(link, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"peak {peak:,} bytes while refusing /dev/zero"


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_a_csv_record_over_the_limit_is_refused_even_over_many_lines(tmp_path, suffix):
    """A quoted field may hold line breaks: the limit counts the whole record, not one line."""
    lines = "\n".join("short line of an abstract" for _ in range(100))  # ~2,600 bytes, 100 lines
    text = f'id,title,abstract\n1,One,"A fine abstract."\n2,Two,"{lines}"\n3,Three,"Another."\n'
    path = tmp_path / f"many{suffix}"
    path.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    with pytest.raises(CorpusError) as err:
        _read_all(path)
    assert str(err.value).startswith(
        f"{path}:3: record longer than 1,000 bytes (the limit for one record)"
    )
    assert [r.title for r in _read_all(path, ReadLimits(record_bytes=5_000))] == [
        "One",
        "Two",
        "Three",
    ]


def test_csv_line_numbers_hold_after_runs_of_blank_lines(tmp_path):
    """Runs of blank lines are counted in bulk (a gzip of newlines): messages still name the
    right line."""
    path = tmp_path / "blanks.csv"
    path.write_text("abstract,title\nfirst abstract,One\n" + "\n" * 3_000_000 + '"bad"x,Two\n')
    with pytest.raises(CorpusError, match=rf"{path.name}:3000003: malformed CSV"):
        _read_all(path, DEFAULT_LIMITS)


def test_a_gzip_that_decompresses_past_the_ratio_is_refused(tmp_path):
    """Many short blank lines pass any line limit: the ratio to the compressed size stops them."""
    path = tmp_path / "newlines.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        fh.write((_record(1) + "\n").encode())
        for _ in range(20):
            fh.write(b"\n" * 100_000)
    size = path.stat().st_size
    assert size * 20 < 100_000  # the floor applies here, not the ratio
    with pytest.raises(CorpusError) as err:
        _read_all(path)
    msg = str(err.value)
    assert msg.startswith(
        f"{path}: decompresses to more than 100,000 bytes, 20x its compressed size of {size:,}"
        " bytes"
    )
    assert "not a gzip bomb" in msg and "decompress it and pass the plain file" in msg
    # A real dump (about 3x) passes the default ratio.
    assert len(_read_all(path, ReadLimits(gzip_floor_bytes=3_000_000))) == 1


def test_a_gzip_of_spaces_in_one_line_ends_at_the_line_limit(tmp_path):
    path = tmp_path / "spaces.jsonl.gz"
    with gzip.open(path, "wb") as fh:
        for _ in range(10):
            fh.write(b" " * 100_000)
    with pytest.raises(CorpusError, match=r"spaces\.jsonl\.gz:1: line longer than 1,000 bytes"):
        _read_all(path, ReadLimits(record_bytes=1_000, gzip_floor_bytes=10**9))


@pytest.mark.parametrize("name", ["big.json", "big.json.gz", "big.txt"])
def test_a_document_read_whole_is_bounded(tmp_path, name):
    records = [json.loads(_record(i)) for i in range(2_000)]
    text = (
        json.dumps(records)
        if ".json" in name
        else "Seeds\n\n" + "\n\n".join(r["abstract"] for r in records)
    )
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    limits = ReadLimits(document_bytes=50_000, gzip_floor_bytes=10**9)
    with pytest.raises(CorpusError) as err:
        parse_file(path, limits)
    assert str(err.value).startswith(
        f"{path}: longer than 50,000 bytes (the limit for a file read whole"
    )
    assert "convert it to JSONL" in str(err.value)
    # seeds: one text
    assert len(parse_file(path, ReadLimits(document_bytes=10**7)).records) in (1, 2_000)


def _rag(args: list[str], cwd: Path, memory_gib: float = 2.0) -> subprocess.CompletedProcess:
    """`rag` in a child under an address-space cap, so an unbounded read fails fast instead of
    filling the machine (before this change: a MemoryError traceback or a kill)."""
    cap = int(memory_gib * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = {**os.environ, "RAG_LLM": "none"}
    return subprocess.run(
        [sys.executable, "-m", "rag.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
    )


@pytest.mark.parametrize("name", ["zero.jsonl", "zero.csv", "zero.json"])
def test_rag_ingest_of_dev_zero_ends_in_one_line(tmp_path, name):
    link = tmp_path / name
    link.symlink_to("/dev/zero")
    done = _rag(["ingest", str(link), "--store", str(tmp_path / "store")], tmp_path)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"rag: error: {link}")
    assert "limit" in lines[0] and (
        "4,194,304 bytes" in lines[0] or "134,217,728 bytes" in lines[0]
    )
    assert not (tmp_path / "store" / "papers.sqlite").exists()


def test_rag_ingest_of_a_gzip_bomb_ends_in_one_line(tmp_path):
    """A small bomb with the default limits: 200 MB of newlines, then 200 MB of spaces (about 400
    KB of gzip)."""
    path = tmp_path / "bomb.jsonl.gz"
    with gzip.open(path, "wb", compresslevel=9) as fh:
        block = b"\n" * 2**20
        for _ in range(200):
            fh.write(block)
    done = _rag(["ingest", str(path), "--store", str(tmp_path / "store")], tmp_path)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "decompresses to more than 16,777,216 bytes" in done.stderr
