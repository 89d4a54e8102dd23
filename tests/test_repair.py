"""Damaged stores (issue 31, items 5 and 6): `rag doctor` names a fix that keeps the user's papers,
`rag repair` re-indexes what the store still holds, and no command shows a traceback on the way.

Real parts: a store of the user's own papers (30 ICML 2026 records, no seeds) built by a real
ingest, damaged on disk the way the attacker did (a corrupt header, garbled pages, a deleted or
truncated Chroma), then the real `rag` commands. `rag repair` runs in a process of its own; the
commands that look at the store before it, and those that check its work after it, share one fresh
process per side (`tests/cli_batch.py`: the real `rag.cli.main` per command, Chroma's client cache
dropped between them), which saves starting Python and loading the embedding model for each."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.cli_batch import run_cli_batch
from tests.conftest import icml_rows, run_cli, write_jsonl

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

# Enough for a manifest of dozens of pages (garbling every 5th one hits interior and leaf pages
# alike) and few enough that each test's `rag repair`, which re-embeds every paper, stays cheap.
N_PAPERS = 30


@pytest.fixture(scope="module")
def user_papers(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The user's own file: 30 ICML 2026 records with an OpenReview id (no seeds anywhere)."""
    rows = [row for row in icml_rows() if row.get("id") and row.get("abstract")][:N_PAPERS]
    return write_jsonl(tmp_path_factory.mktemp("papers") / "mine.jsonl", rows), rows


@pytest.fixture(scope="module")
def user_store(tmp_path_factory, user_papers) -> Path:
    from rag import RAG

    store = tmp_path_factory.mktemp("user_store") / "store"
    rag = RAG(store_dir=store)
    assert rag.ingest(user_papers[0], include_corpus=False).new_papers == N_PAPERS
    # the last connection checkpoints the WAL: the damage below hits the file the data is in
    rag.store.close()
    assert (
        not (store / "papers.sqlite-wal").exists()
        or (store / "papers.sqlite-wal").stat().st_size == 0
    )
    return store


@pytest.fixture
def store(tmp_path, user_store) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(user_store, copy)
    return copy


def _paper_ids(store: Path) -> set[str]:
    conn = sqlite3.connect(store / "papers.sqlite")
    try:
        return {r[0] for r in conn.execute("SELECT DISTINCT paper_id FROM chunks")}
    finally:
        conn.close()


def _one_line(proc, *needles: str) -> str:
    """The command failed (exit 1) with one line on stderr, no traceback, naming each needle."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # Progress lines ("rag: map: laying out ...") may come first; the error is one line.
    lines = [
        line
        for line in proc.stderr.strip().splitlines()
        if not line.startswith(("rag: map:", "rag: ingest:"))
    ]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _doctor_cmd(store: Path) -> list[str]:
    return ["doctor", "--json", "--store", str(store)]


def _doctor_checks(proc) -> dict[str, dict]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return {c["name"]: c for c in json.loads(proc.stdout)}


def _doctor(store: Path) -> dict[str, dict]:
    return _doctor_checks(run_cli(*_doctor_cmd(store)))


def _with_doctor(store: Path, *commands: list[str]) -> tuple[list, dict[str, dict]]:
    """Each command on the damaged store (`--store` appended), then `rag doctor --json`: one
    process."""
    *procs, doctor = run_cli_batch(
        *([*args, "--store", str(store)] for args in commands), _doctor_cmd(store)
    )
    return procs, _doctor_checks(doctor)


def _repaired_everything(store: Path, rows: list[dict], expect: set[str] | None = None) -> None:
    """`rag repair` as the doctor advised, then every paper is back, dense search answers without
    warning, and each sampled paper is found by its own title (the doctor and the searches: one
    process)."""
    proc = run_cli("repair", "--store", str(store))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"re-indexed {len(expect or rows)} papers"), proc.stdout
    assert _paper_ids(store) == (expect if expect is not None else {r["id"] for r in rows})
    doctor, *searches = run_cli_batch(
        _doctor_cmd(store),
        *(
            ["search", row["title"], "--json", "--mode", "dense", "--k", "3", "--store", str(store)]
            for row in rows[:3]
        ),
    )
    checks = _doctor_checks(doctor)
    assert all(c["status"] == "ok" for name, c in checks.items() if name in ("store", "vectors")), (
        checks
    )
    for row, found in zip(rows[:3], searches, strict=True):
        assert found.returncode == 0 and "warning" not in found.stderr, found.stderr
        assert row["id"] in [s["paper_id"] for s in json.loads(found.stdout)["results"]]


def _doctor_keeps_papers(check: dict) -> None:
    assert check["status"] == "fail" and check["fix"].startswith("rag repair --store"), check
    assert "--rebuild" not in check["fix"]


def test_corrupt_header_names_the_repair_everywhere_and_repair_keeps_every_paper(
    store, user_papers
):
    path = store / "papers.sqlite"
    data = bytearray(path.read_bytes())
    data[:16] = b"not a database!!"
    path.write_bytes(bytes(data))
    procs, checks = _with_doctor(
        store,
        ["search", "attention"],
        ["stats"],
        ["ask", "what is attention?"],
        ["map", "--out", str(store.parent / "m.html")],
        ["ingest", str(user_papers[0])],
    )
    for proc in procs:
        line = _one_line(proc, "papers.sqlite", "damaged", f"rag repair --store {store}")
        assert "permissions" not in line
    _doctor_keeps_papers(checks["store"])
    assert "file is not a database" in checks["store"]["detail"]
    _repaired_everything(store, user_papers[1])
    kept = list(store.glob("damaged-*/papers.sqlite"))
    # the damaged file is kept
    assert len(kept) == 1 and kept[0].read_bytes()[:16] == b"not a database!!"


def test_deleted_chroma_falls_back_and_repair_restores_the_vectors(store, user_papers):
    shutil.rmtree(store / "chroma")
    [found], checks = _with_doctor(store, ["search", user_papers[1][0]["title"], "--json"])
    assert found.returncode == 0, found.stderr
    assert [line for line in found.stderr.splitlines() if "warning" in line] == [
        found.stderr.strip()
    ]
    assert "holds no vectors" in found.stderr and "rag repair" in found.stderr
    # keywords found it
    assert json.loads(found.stdout)["results"][0]["paper_id"] == user_papers[1][0]["id"]
    _doctor_keeps_papers(checks["vectors"])
    _repaired_everything(store, user_papers[1])


def test_truncated_chroma_sqlite_falls_back_to_keywords_with_one_warning(store, user_papers):
    with open(store / "chroma" / "chroma.sqlite3", "r+b") as fh:
        fh.truncate(8192)
    title = user_papers[1][1]["title"]
    (*answers, map_proc), checks = _with_doctor(
        store,
        ["search", title, "--json"],
        ["ask", title, "--json", "--no-llm"],
        ["map", "--out", str(store.parent / "m.html")],
    )
    for proc in answers:
        assert proc.returncode == 0, proc.stderr
        warnings = proc.stderr.strip().splitlines()
        assert len(warnings) == 1 and warnings[0].startswith("rag: warning: the vectors in"), (
            proc.stderr
        )
        assert "keyword retrieval" in warnings[0] and f"rag repair --store {store}" in warnings[0]
        out = json.loads(proc.stdout)
        assert user_papers[1][1]["id"] in [
            s["paper_id"] for s in (out.get("results") or out["sources"])
        ]
    _one_line(map_proc, "rag repair --store")
    _doctor_keeps_papers(checks["vectors"])
    _repaired_everything(store, user_papers[1])


def _garble(path: Path, seed: int = 7) -> None:
    """Random bytes over part of every 5th page after the first two: interior and leaf pages
    alike."""
    rng = random.Random(seed)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        for page in range(2, size // 4096, 5):
            fh.seek(page * 4096 + 200)
            fh.write(bytes(rng.randrange(256) for _ in range(1500)))


def test_garbled_pages_give_no_traceback_and_repair_keeps_what_is_readable(store, user_papers):
    _garble(store / "papers.sqlite")
    procs, checks = _with_doctor(
        store,
        ["search", "attention"],
        ["ask", "what is attention?"],
        ["map", "--out", str(store.parent / "m.html")],
        ["ingest", str(user_papers[0])],
        ["doctor"],
    )
    for proc in procs:
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
        if proc.returncode == 1 and proc.args[1] != "doctor":
            _one_line(proc, "rag repair --store")
    _doctor_keeps_papers(checks["store"])
    proc = run_cli("repair", "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    kept = _paper_ids(store)
    lost_files = list(store.glob("damaged-*/lost-papers.txt"))
    lost = set(lost_files[0].read_text().split()) if lost_files else set()
    # Every paper is accounted for: back in the index, or listed by id (from Chroma) as lost.
    assert kept | lost == {r["id"] for r in user_papers[1]} and not kept & lost
    # leaf pages are scanned past the garbled b-tree
    assert len(kept) >= 0.75 * N_PAPERS, proc.stdout
    # as ingest stores them
    titles = {r["id"]: " ".join(r["title"].split()) for r in user_papers[1]}
    conn = sqlite3.connect(store / "papers.sqlite")
    try:
        rows = conn.execute("SELECT paper_id, title, authors FROM papers").fetchall()
        # Nothing garbled was re-indexed as a paper; a paper whose own row was lost has its title
        # from its chunks.
        assert sum(title != titles[pid] for pid, title, _ in rows) == 0, [
            r for r in rows if r[1] != titles[r[0]]
        ]
        without = sum(authors == "[]" for _, _, authors in rows)
        assert (f"{without} papers came back without their authors" in proc.stdout) == (
            without > 0
        ), proc.stdout
    finally:
        conn.close()
    back = run_cli("search", titles[min(kept)], "--json", "--store", str(store))
    assert back.returncode == 0 and back.stderr == "", back.stderr


def test_unreadable_manifest_is_said_honestly_and_the_ids_are_kept(store, user_papers):
    (store / "papers.sqlite").write_bytes(b"\0" * 65536)
    for name in ("papers.sqlite-wal", "papers.sqlite-shm"):
        (store / name).unlink(missing_ok=True)
    proc = run_cli("repair", "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    assert (
        "papers.sqlite could not be read at all" in proc.stdout
        and "Chroma keeps only ids" in proc.stdout
    )
    assert f"{N_PAPERS} papers could not be recovered" in proc.stdout
    lost = next(store.glob("damaged-*/lost-papers.txt")).read_text().split()
    assert set(lost) == {r["id"] for r in user_papers[1]}  # from Chroma's metadata
    # The store is usable again: re-ingesting the user's file brings every paper back.
    again = run_cli("ingest", str(user_papers[0]), "--store", str(store))
    assert again.returncode == 0, again.stderr
    assert _paper_ids(store) == set(lost)


def test_scan_pages_reads_rows_under_a_garbled_interior_page(tmp_path):
    """The page scanner alone, on a table whose root page is garbled: SQL reaches nothing, the scan
    every row."""
    from rag.index.repair import salvage_manifest, scan_pages

    db = tmp_path / "papers.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE t (a TEXT, b INTEGER);")
    conn.executemany(
        "INSERT INTO t VALUES (?, ?)", ((f"row {i} " + "x" * 300, i) for i in range(400))
    )
    conn.commit()
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name='t'").fetchone()[0]
    conn.close()
    with open(db, "r+b") as fh:
        fh.seek((root - 1) * 4096)
        fh.write(b"\xff" * 4096)
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.DatabaseError):
        conn.execute("SELECT COUNT(*) FROM t").fetchall()
    conn.close()
    rows = {values[1] for _, values in scan_pages(db) if len(values) == 2}
    assert rows == set(range(400))
    work = tmp_path / "work"
    work.mkdir()
    assert salvage_manifest(db, work).papers == {}  # rows of other tables are not taken for papers


def test_doctor_on_another_model_offers_a_fix_that_keeps_papers(store):
    proc = run_cli(
        "doctor",
        "--json",
        "--store",
        str(store),
        env={"RAG_EMBED_MODEL": "openai:text-embedding-3-small"},
    )
    check = {c["name"]: c for c in json.loads(proc.stdout)}["store"]
    assert check["status"] == "fail"
    assert check["fix"].startswith(
        "set RAG_EMBED_MODEL=minilm-l6-ml-v1, or re-index every paper with the new model"
    )
    assert "--rebuild" not in check["fix"]


def test_missing_vectors_of_some_chunks_are_repaired_not_rebuilt(store, user_papers):
    """Some vectors gone (a Chroma restored from an older backup, say): the doctor counts them and
    the repair puts them back; no `--rebuild` (which would leave only the seeds) is advised."""
    from rag import RAG

    rag = RAG(store_dir=store)
    gone = [r["id"] for r in user_papers[1][:10]]
    rag.store.collection().delete(where={"paper_id": {"$in": gone}})
    del rag
    vectors = _doctor(store)["vectors"]
    _doctor_keeps_papers(vectors)
    assert "chunks have no vector" in vectors["detail"]
    _repaired_everything(store, user_papers[1])
