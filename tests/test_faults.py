"""Faults and data safety, with the real `rag` command in subprocesses and a real store on disk.

- SIGKILL an ingest right after it starts, mid-way through embedding, between writing a batch's
  vectors and committing its rows, and between the last commit and the keyword-index save; then the
  store opens, answers, holds whole papers only, and a re-run finishes only the missing work.
- Two ingests at once into one store; searches while an ingest runs.
- A store of an older schema or built with another embedding model.
- A read-only store (as `nobody`, via setpriv) and a full disk (a small tmpfs filled at chosen
  moments).

Fault points are made exact rather than guessed with sleeps: the test watches the manifest
(`papers.sqlite`, read-only) to see batches commit, holds the manifest's write lock to freeze an
ingest after it wrote a batch's vectors and before it commits the rows, and puts a FIFO where the
keyword index is written to freeze an ingest after its last commit (and sees, in /proc, the ingest
blocked opening it).

Every ingest is a `rag ingest` process of its own. The read-only commands that look at a store at
one fault point (`rag stats`, several `rag search`) run in one fresh process per fault point
(`tests/cli_batch.py`: the real `rag.cli.main` per command, Chroma's client cache dropped between
them), which saves starting Python and loading the embedding model for each of them; a command that
must start cold (the first search on a full disk) still gets a process of its own.

The ingests (kill and resume, two writers, searches during an ingest, a full disk) embed with the
hashing embedder (`rag.testing.HashEmbedder` behind an OpenAI-compatible endpoint on loopback,
tests/hash_embeddings.py, configured as a user configures an embeddings service): what they assert
is crash safety, locking and recovery, not retrieval quality, and the real model's CPU was most of
their time. The endpoint sleeps per text, as a model takes time per text, so that an ingest can
still be stopped while it embeds a batch. The tests on the seed store (another schema, another
model, read-only) keep the bundled model: its name is what they check.

Tests that need root (setpriv, mount) skip with the reason when it is missing, unless `CI` is set:
then they fail.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import gzip
import hashlib
import itertools
import json
import os
import pwd
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rag.index.ingest import PAPERS_PER_BATCH
from tests.cli_batch import run_cli_batch
from tests.conftest import ICML_SAMPLE, run_cli, write_jsonl
from tests.hash_embeddings import HashEmbeddings

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

DATA = ICML_SAMPLE
RAG_EXE = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
SUMMARY = re.compile(r"indexed (\d+) new papers?")


# ---- helpers: the environment ------------------------------------------------------------------


def _require(ok: bool, why: str) -> None:
    """Skip when a privilege is missing, except under CI, where the fault tests must run."""
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: these fault tests must run)")
    pytest.skip(why)


def _nobody_group() -> str:
    for name in ("nogroup", "nobody"):
        with contextlib.suppress(KeyError):
            grp.getgrnam(name)
            return name
    return "65534"


# `nobody` keeps CAP_DAC_READ_SEARCH only: it may read and traverse anything (the interpreter lives
# under /root, mode 0700), but write nowhere it has no permission to. That is a read-only directory.
NOBODY = [
    "setpriv",
    "--reuid=nobody",
    f"--regid={_nobody_group()}",
    "--clear-groups",
    "--inh-caps=-all,+dac_read_search",
    "--ambient-caps=+dac_read_search",
    "--bounding-set=-all,+dac_read_search",
    "--nnp",
]


class Procs:
    """Subprocesses started by a test; any still running at teardown are killed (by pid)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.running: list[Ingest] = []
        self._n = itertools.count()

    def ingest(self, *args: str | Path, env: dict | None = None) -> Ingest:
        run = Ingest(self.tmp / f"run{next(self._n)}", [RAG_EXE, "ingest", *map(str, args)], env)
        self.running.append(run)
        return run

    def kill_all(self) -> None:
        for run in self.running:
            if run.proc.poll() is None:
                os.kill(run.proc.pid, signal.SIGKILL)
                run.proc.wait()


class Ingest:
    """One `rag ingest` subprocess; output goes to files (no pipe can fill up and stall it)."""

    def __init__(self, base: Path, argv: list[str], env: dict | None) -> None:
        self.out_path, self.err_path = base.with_suffix(".out"), base.with_suffix(".err")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=err, text=True, env={**os.environ, **(env or {})}
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 600) -> tuple[int, str, str]:
        rc = self.proc.wait(timeout=timeout)
        return rc, self.out_path.read_text(), self.err_path.read_text()

    def kill(self) -> None:
        """SIGKILL; fails the test if the ingest had already finished (the fault would be a
        no-op)."""
        assert self.running(), (
            f"the ingest ended before it could be killed: {self.err_path.read_text()[-2000:]}"
        )
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=60) == -signal.SIGKILL


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.kill_all()


# Seconds the hashing endpoint sleeps per embedded text: a batch of 64 abstracts (~100 chunks) then
# takes ~2 s to embed, the window in which a test stops an ingest mid-embedding or takes the
# manifest's lock before the batch is written (the bundled model took ~3-10 s per batch here, all of
# it CPU).
EMBED_PAUSE = 0.02


@pytest.fixture(scope="module")
def _hash_endpoint():
    with HashEmbeddings() as endpoint:
        yield endpoint


@pytest.fixture
def hash_embedder(_hash_endpoint, monkeypatch) -> Iterator[HashEmbeddings]:
    """Every `rag` process this test starts (ingests, `run_cli`, `run_cli_batch`) embeds through the
    hashing endpoint: the environment they inherit names it (RAG_EMBED_MODEL=openai:test-hash,
    RAG_EMBED_BASE_URL)."""
    _hash_endpoint.pause_per_text = EMBED_PAUSE
    for name, value in _hash_endpoint.env.items():
        monkeypatch.setenv(name, value)
    yield _hash_endpoint
    # a test that held batches lets the next test's ingests run freely
    _hash_endpoint.hold_batches(0)


# ---- helpers: the corpus -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def icml_rows() -> list[dict]:
    """Records 0..599 of the ICML 2026 file that have an id (real abstracts)."""
    rows = []
    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i >= 600:
                break
            row = json.loads(line)
            if row.get("id") is not None:
                rows.append(row)
    assert len(rows) > 550
    return rows


def _corpus(
    tmp_path: Path, rows: list[dict], name: str = "corpus.jsonl"
) -> tuple[Path, dict[str, dict]]:
    """Write the rows; return the file and the expected papers (OpenReview urls: the id is the paper
    id)."""
    by_id = {r["id"]: r for r in rows if (r.get("abstract") or "").strip()}
    assert all("openreview.net" in (r.get("url") or "") for r in rows)
    return write_jsonl(tmp_path / name, rows), by_id


# ---- helpers: looking at a store without the library -------------------------------------------


def _ro(db: Path) -> contextlib.closing:
    """The manifest, to read. Opened read-write (never created): a process killed mid-transaction
    leaves a hot journal, which SQLite rolls back on the next open, as the next ingest's does; a
    read-only connection cannot, and fails with "attempt to write a readonly database"."""
    return contextlib.closing(sqlite3.connect(f"file:{db}?mode=rw", uri=True, timeout=30))


def _committed(store: Path) -> int:
    """Papers whose rows are committed, read directly from the manifest (0 before it exists)."""
    try:
        with _ro(store / "papers.sqlite") as db:
            return db.execute("SELECT COUNT(DISTINCT paper_id) FROM chunks").fetchone()[0]
    except sqlite3.Error:
        return 0


def _chroma_rows(store: Path) -> int:
    """Vectors Chroma has written (its own sqlite table; used only to time a fault, never
    asserted)."""
    try:
        with _ro(store / "chroma" / "chroma.sqlite3") as db:
            return db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0]
    except sqlite3.Error:
        return -1


def _wait_until(cond, what: str, run: Ingest | None = None, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if run is not None and not run.running():
            rc, _, err = run.wait()
            pytest.fail(f"the ingest exited with {rc} before {what}: {err[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def _manifest_write_lock(store: Path):
    """Hold the manifest's write lock: an ingest then blocks after writing a batch's vectors,
    right before committing its rows (it waits up to 30 s for the lock, from the moment it asks)."""
    conn = sqlite3.connect(store / "papers.sqlite", timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        conn.close()


def _check_manifest(store: Path, papers: dict[str, dict]) -> dict:
    """Whole papers only: each abstract's chunks are seq 0..m-1 and cover every word of it."""
    with _ro(store / "papers.sqlite") as db:
        tables = {
            name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not {"chunks", "papers"} <= tables:  # killed before the schema was created
            return {"papers": 0, "chunks": 0, "ids": set(), "chunk_ids": set(), "rowids": set()}
        chunks = db.execute(
            "SELECT rowid, chunk_id, paper_id, abstract_hash, seq, text, abstract FROM chunks"
        ).fetchall()
        paper_rows = {r[0] for r in db.execute("SELECT paper_id FROM papers")}
    chunk_ids = [c[1] for c in chunks]
    assert len(set(chunk_ids)) == len(chunk_ids), "duplicate chunk ids in the manifest"
    with_chunks = {c[2] for c in chunks}
    assert paper_rows == with_chunks, (
        f"paper rows without chunks: {sorted(paper_rows - with_chunks)[:5]}; "
        f"chunks without a paper row: {sorted(with_chunks - paper_rows)[:5]}"
    )
    assert with_chunks <= set(papers), (
        f"unknown papers in the index: {sorted(with_chunks - set(papers))[:5]}"
    )
    by_abstract = defaultdict(list)
    for _, _, pid, ahash, seq, text, abstract in chunks:
        by_abstract[(pid, ahash)].append((seq, text, abstract))
    for (pid, _), items in by_abstract.items():
        seqs = sorted(s for s, _, _ in items)
        assert seqs == list(range(len(seqs))), (
            f"paper {pid} has a partial set of chunks: seq {seqs}"
        )
        abstract = items[0][2]
        assert abstract == " ".join(papers[pid]["abstract"].split()), (
            f"paper {pid}: stored abstract differs"
        )
        missing = set(abstract.split()) - set(" ".join(t for _, t, _ in items).split())
        assert not missing, f"paper {pid}: words of its abstract in no chunk: {sorted(missing)[:5]}"
    return {
        "papers": len(with_chunks),
        "chunks": len(chunks),
        "ids": with_chunks,
        "chunk_ids": set(chunk_ids),
        "rowids": {c[0] for c in chunks},
    }


def _stats_cmd(store: Path) -> list[str]:
    return ["stats", "--json", "--store", str(store)]


def _search_cmd(store: Path, query: str, mode: str = "hybrid", k: int = 5) -> list[str]:
    return ["search", query, "--json", "--k", str(k), "--mode", mode, "--store", str(store)]


def _stats_match(proc: subprocess.CompletedProcess, state: dict) -> None:
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    stats = json.loads(proc.stdout)
    assert (stats["papers"], stats["chunks"]) == (state["papers"], state["chunks"]), stats


def _check_stats(store: Path, state: dict) -> None:
    _stats_match(run_cli(*_stats_cmd(store)), state)


def _check_search(store: Path, query: str, mode: str = "hybrid", k: int = 5) -> list[str]:
    return _search_ids(store, run_cli(*_search_cmd(store, query, mode, k)))


def _look(store: Path, state: dict, *searches: tuple[str, str, int]) -> list[list[str]]:
    """`rag stats` matches `state` and each (query, mode, k) search passes `_search_ids`: one
    process for all."""
    stats, *found = run_cli_batch(
        _stats_cmd(store), *(_search_cmd(store, *search) for search in searches)
    )
    _stats_match(stats, state)
    return [_search_ids(store, proc) for proc in found]


def _search_ids(store: Path, proc: subprocess.CompletedProcess) -> list[str]:
    """`rag search` answered, and every paper it returns is committed, with a passage of its own."""
    query, mode = proc.args[2], proc.args[proc.args.index("--mode") + 1]
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (
        f"rag search --mode {mode} {query!r} exited {proc.returncode}: {proc.stderr[-2000:]}"
    )
    results = json.loads(proc.stdout)["results"]
    ids = [r["paper_id"] for r in results]
    assert results and len(set(ids)) == len(ids), ids
    with _ro(store / "papers.sqlite") as db:
        for r in results:
            texts = {
                t
                for (t,) in db.execute("SELECT text FROM chunks WHERE paper_id=?", (r["paper_id"],))
            }
            assert texts, f"search returned {r['paper_id']}, which has no committed rows"
            assert r["passage"] in texts, (
                f"the passage shown for {r['paper_id']} is not one of its chunks"
            )
    return ids


_CHROMA_DUMP = """
import json, sys
import chromadb
from chromadb.config import Settings
client = chromadb.PersistentClient(path=sys.argv[1], settings=Settings(anonymized_telemetry=False))
col = client.get_collection(sys.argv[2])
got = col.get(include=["metadatas"])
papers = {i: m["paper_id"] for i, m in zip(got["ids"], got["metadatas"])}
print(json.dumps({"count": col.count(), "papers": papers}))
"""


def _chroma(store: Path) -> dict | None:
    """The collection "papers" as Chroma reports it, read in a fresh process: embedded Chroma is
    not multi-process safe, and a client kept in the test would cache state across ingests."""
    if not (store / "chroma").exists():
        return None
    proc = subprocess.run(
        [sys.executable, "-c", _CHROMA_DUMP, str(store / "chroma"), "papers"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"Chroma cannot open the store's vectors: {proc.stderr[-2000:]}"
    data = json.loads(proc.stdout)
    return {"count": data["count"], "ids": set(data["papers"]), "papers": data["papers"]}


def _check_keyword_index(store: Path, state: dict) -> None:
    from rag.index.keyword import KeywordIndex

    path = store / "keyword.json"
    leftovers = [
        p.name
        for d in (store, store / "keyword")
        if d.is_dir()
        for p in d.iterdir()
        if p.name.endswith(".tmp")
    ]
    _check(
        path.exists(),
        f"{path.name} is missing after a completed re-run (every query process then "
        f"rebuilds BM25 from the manifest); temporary files left: {leftovers}",
    )
    keys = set(KeywordIndex.load(path).keys.tolist())
    _check(
        keys == state["rowids"],
        f"the keyword index covers {len(keys)} chunks, the manifest {len(state['rowids'])}",
    )
    _check(not leftovers, f"temporary files left in the store: {leftovers}")


def _check_complete(store: Path, papers: dict[str, dict], *searches: tuple[str, str, int]) -> dict:
    """Every paper whole in the manifest, `rag stats`, Chroma and the keyword index; `searches`
    (query, mode, k) run with the stats (see `_look`), their paper ids in state["found"]."""
    state = _check_manifest(store, papers)
    assert state["ids"] == set(papers), (
        f"{state['papers']} papers indexed, expected {len(papers)}; missing"
        f" {sorted(set(papers) - state['ids'])[:5]}"
    )
    state["found"] = _look(store, state, *searches)
    vectors = _chroma(store)
    assert vectors is not None and vectors["count"] == state["chunks"], (
        f"Chroma holds {vectors and vectors['count']} vectors, "
        f"the manifest {state['chunks']} chunks"
    )
    assert vectors["ids"] == state["chunk_ids"]
    _check_keyword_index(store, state)
    return state


def _check(ok: bool, message: str) -> None:
    """An assertion whose message is exactly `message` (it is also collected by `soft`)."""
    if not ok:
        raise AssertionError(message)


def _one_line_error(stderr: str, *patterns: str) -> str:
    # Progress lines (stderr not a terminal, an ingest past 30 s; a map being laid out) are not
    # errors.
    lines = [
        line
        for line in stderr.splitlines()
        if line.strip() and not line.startswith(("rag: ingest: ", "rag: map: "))
    ]
    _check(
        "Traceback" not in stderr,
        f"a traceback instead of one line; it ends with: {lines[-1] if lines else ''}",
    )
    _check(len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr[-3000:]}")
    line = lines[0]
    _check(line.startswith("rag: error: "), f"not a `rag: error:` line: {line!r}")
    for pattern in patterns:
        _check(re.search(pattern, line, re.IGNORECASE) is not None, f"{pattern!r} not in {line!r}")
    return line


def _new_papers(stdout: str) -> int:
    if "nothing new to index" in stdout:
        return 0
    m = SUMMARY.search(stdout)
    assert m, f"no summary line in {stdout!r}"
    return int(m.group(1))


# ---- 1 and 2: SIGKILL, then resume -------------------------------------------------------------


def test_sigkill_at_start_mid_embedding_and_before_a_commit_then_rerun_resumes(
    tmp_path, icml_rows, procs, hash_embedder
):
    """One store of 193 real abstracts, killed three times on the way (right after start;
    mid-embedding once its first batch is committed; between a later batch's vectors and its rows),
    then finished by a re-run that only does the missing work. Three batches of 64 and one paper are
    the fewest that leave work for each step: the second run commits batch 1 and dies embedding
    batch 2; the third commits batch 2 and dies between batch 3's vectors and rows; the re-run
    redoes batch 3 and adds the last paper. Uses the hashing embedder (`hash_embedder`, ~2 s per
    batch): what is asserted is where the kills land and what the store holds after each, not
    retrieval quality (the searches are for papers' own titles)."""
    corpus, papers = _corpus(tmp_path, icml_rows[: 3 * PAPERS_PER_BATCH + 1])
    total = len(papers)
    store = tmp_path / "store"

    # 1. Right after start: the store exists, the first batch is not committed yet.
    run = procs.ingest(corpus, "--no-corpus", "--store", store)
    _wait_until(lambda: (store / "papers.sqlite").exists(), "the manifest appears", run)
    run.kill()
    state = _check_manifest(store, papers)
    assert state["papers"] == 0, "the kill right after start landed after a commit"
    print(f"killed right after start: {state['papers']} papers committed")
    _check_stats(store, state)

    # 2. Mid-way through embedding, once its first batch is committed: the ingest commits a batch on
    # its writer thread while it embeds the next one (rag/index/ingest.py), so when a commit shows,
    # the next batch's embedding has begun, and it takes seconds (EMBED_PAUSE).
    run = procs.ingest(corpus, "--no-corpus", "--store", store)
    _wait_until(lambda: _committed(store) >= PAPERS_PER_BATCH, "the first batch is committed", run)
    run.kill()
    state = _check_manifest(store, papers)
    assert PAPERS_PER_BATCH <= state["papers"] < total
    print(f"killed mid-embedding: {state['papers']} papers, {state['chunks']} chunks committed")
    pid = next(pid for pid in papers if pid in state["ids"])
    for found in _look(
        store, state, *((papers[pid]["title"], mode, 5) for mode in ("hybrid", "bm25", "dense"))
    ):
        assert pid in found

    # 3. Once this run has committed a batch of its own, between writing the next batch's vectors
    # and committing its rows.
    resumed_at = state["papers"]
    run = procs.ingest(corpus, "--no-corpus", "--store", store)
    _wait_until(
        lambda: _committed(store) >= resumed_at + PAPERS_PER_BATCH,
        "the re-run commits a batch",
        run,
    )
    with _manifest_write_lock(store):
        before = _chroma_rows(store)
        _wait_until(
            lambda: _chroma_rows(store) > before,
            "the next batch's vectors are written",
            run,
            timeout=180,
        )
        run.kill()
    state = _check_manifest(store, papers)
    assert resumed_at + PAPERS_PER_BATCH <= state["papers"] < total
    vectors = _chroma(store)
    orphans = vectors["ids"] - state["chunk_ids"]
    assert orphans, "the kill did not land between vectors and rows (no orphan vectors)"
    print(
        f"killed between vectors and rows: {state['papers']} papers committed, {len(orphans)}"
        " orphan vectors"
    )
    assert state["chunk_ids"] <= vectors["ids"], "committed chunks without vectors"
    orphan_papers = {vectors["papers"][cid] for cid in orphans}
    assert not orphan_papers & state["ids"], "a paper has committed rows and orphan vectors at once"
    # Searching for an orphaned paper's own title finds committed papers only.
    orphan_pid = min(orphan_papers)
    orphan_title = papers[orphan_pid]["title"]
    for found in _look(store, state, (orphan_title, "dense", 10), (orphan_title, "hybrid", 10)):
        assert not set(found) & orphan_papers

    # 4. The re-run resumes: only the missing papers are indexed; orphans are overwritten.
    before_rerun = state["papers"]
    rc, out, err = procs.ingest(corpus, "--no-corpus", "--store", store).wait()
    assert rc == 0 and "Traceback" not in err, err
    new = _new_papers(out)
    assert 0 < new < total, out
    assert new + before_rerun == total, f"{new} new + {before_rerun} before the re-run != {total}"
    print(f"re-run: {out.strip()}")
    final = _check_complete(store, papers, (orphan_title, "hybrid", 5))
    assert "already indexed" in out
    assert orphan_pid in final["found"][0]

    # 5. And once more: nothing to do, nothing changes.
    rc, out, err = procs.ingest(corpus, "--no-corpus", "--store", store).wait()
    assert rc == 0 and "nothing new to index" in out, (out, err)
    assert _check_manifest(store, papers)["chunk_ids"] == final["chunk_ids"]


def test_first_ingest_killed_inside_corpus_still_gets_all_of_corpus_on_the_next_ingest(
    tmp_path, icml_rows, procs, seed_titles, hash_embedder
):
    """An ingest with corpus/ killed after its first batch (64 of the 76 seeds) leaves a store that
    is no longer empty, yet still owes the other seeds: the next `rag ingest FILE` adds them. The
    store then holds exactly the 76 seed papers (their ids from corpus/seed_metadata.jsonl) and the
    file's (eight: the file only has to add papers of its own; the seeds are what the kill
    interrupts). Uses the hashing embedder: what is asserted is which papers the store holds, not
    retrieval quality."""
    corpus, papers = _corpus(tmp_path, icml_rows[:8])
    store = tmp_path / "store"
    run = procs.ingest(corpus, "--with-corpus", "--store", store)
    _wait_until(lambda: _committed(store) > 0, "the first batch is committed", run)
    with _manifest_write_lock(store):  # no second commit from here on
        committed = _committed(store)
        run.kill()
    assert 0 < committed < 76, f"{committed} papers at the kill: not inside corpus/"
    rc, out, err = procs.ingest(corpus, "--store", store).wait()
    assert rc == 0 and "Traceback" not in err, err
    with _ro(store / "papers.sqlite") as db:
        ids = {pid for (pid,) in db.execute("SELECT DISTINCT paper_id FROM chunks")}
    expected = set(seed_titles) | set(papers)
    assert len(seed_titles) == 76 and len(expected) > 76
    assert ids == expected, (
        f"missing {sorted(expected - ids)[:5]}, unexpected {sorted(ids - expected)[:5]}"
    )
    rc, out, _ = procs.ingest(corpus, "--store", store).wait()
    assert rc == 0 and "nothing new to index" in out, out


def _blocked_opening_a_fifo(run: Ingest) -> bool:
    """Whether a thread of the ingest waits in the kernel for a FIFO's reader (opening one to
    write)."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{run.proc.pid}/task").iterdir():
            if (task / "wchan").read_text().strip() == "wait_for_partner":
                return True
    return False


def test_sigkill_between_last_commit_and_keyword_save_is_repaired_by_a_rerun(
    tmp_path, icml_rows, procs, hash_embedder
):
    """A FIFO where the keyword index is written freezes the ingest after its last commit; kill it
    there. Uses the hashing embedder: what is asserted is the repair of the keyword index, not
    retrieval quality."""
    corpus, papers = _corpus(tmp_path, icml_rows[:70])
    store = tmp_path / "store"
    store.mkdir()
    fifo = store / "keyword.json.tmp"
    os.mkfifo(fifo)
    run = procs.ingest(corpus, "--no-corpus", "--store", store)
    _wait_until(lambda: _committed(store) == len(papers), "every paper is committed", run)
    if not run.running():
        pytest.fail(
            "the ingest finished: it no longer writes its keyword index through keyword.json.tmp, "
            "so this test's freeze point needs updating"
        )
    # Seen, not guessed with a sleep: the ingest's thread waits in open() for the FIFO's reader. (An
    # ingest that finished instead fails here: it no longer writes its keyword index through
    # keyword.json.tmp.)
    _wait_until(
        lambda: _blocked_opening_a_fifo(run),
        "the ingest blocks opening keyword.json.tmp",
        run,
        timeout=120,
    )
    run.kill()  # it is blocked opening the keyword index's temporary file
    fifo.unlink()
    assert not (store / "keyword.json").exists()
    state = _check_manifest(store, papers)
    assert state["ids"] == set(papers)
    last = list(papers)[-1]  # in the last batch: only in a keyword index rebuilt from the manifest
    assert last in _look(store, state, (papers[last]["title"], "bm25", 3))[0]

    rc, out, err = procs.ingest(corpus, "--no-corpus", "--store", store).wait()
    assert rc == 0 and "Traceback" not in err, err
    assert _new_papers(out) == 0
    _check_complete(store, papers)


# ---- 3: two writers ----------------------------------------------------------------------------


def test_two_ingests_at_once_one_is_refused_and_nothing_is_doubled(
    tmp_path, icml_rows, procs, hash_embedder
):
    """Uses the hashing embedder (~2 s per batch of three, so a writer is still at work when the
    third ingest starts): what is asserted is the store's lock and that nothing is doubled, not
    retrieval quality."""
    corpus, papers = _corpus(tmp_path, icml_rows[:130])
    store = tmp_path / "store"
    first, second = (
        procs.ingest(corpus, "--no-corpus", "--store", store),
        procs.ingest(corpus, "--no-corpus", "--store", store),
    )
    _wait_until(
        lambda: _committed(store) > 0 or not (first.running() or second.running()),
        "the first batch is committed",
    )
    assert first.running() or second.running(), (
        "both ingests ended before the first commit was seen"
    )
    third = procs.ingest(corpus, "--no-corpus", "--store", store)  # while one of them is writing
    results = [run.wait() for run in (first, second, third)]

    new_total, refused = 0, 0
    for rc, out, err in results:
        print(f"concurrent ingest: exit {rc}: {(out + err).strip()}")
        if rc == 1:
            _one_line_error(err, "another ingest is writing")
            refused += 1
        else:
            assert rc == 0 and "Traceback" not in err, err  # a waiting writer would be fine too
            new_total += _new_papers(out)
    assert new_total == len(papers), (
        f"the ingests together report {new_total} new papers, expected {len(papers)}"
    )
    _check_complete(store, papers)


# ---- 4: queries during an ingest ---------------------------------------------------------------


def test_searches_during_an_ingest_see_a_consistent_index(
    tmp_path, icml_rows, procs, hash_embedder
):
    """Two searchers query the store while a 200-paper ingest writes it, from its first commit to
    its end. Each searcher is one process for the whole ingest that runs `rag search` after `rag
    search` (`tests/cli_batch.py`: each command opens the store anew, as a process of its own
    would), 0.5 s apart so that the ingest keeps most of the CPU (still several times as many
    searches during the ingest as a process per search gave); a search counts as during the ingest
    when it started before the ingest ended (watched from a thread). Uses the hashing embedder: what
    is asserted is that every search sees committed papers only, not retrieval quality. The overlap
    is made, not hoped for: once the first batch is committed, the endpoint answers each later
    embedding request of the ingest (batches 3 and 4, ~100 and ~13 chunks: three requests of at most
    64 texts) only after two more questions came from the searchers (`hold_batches`), so at least
    six searches run during the ingest however busy the machine is."""
    corpus, papers = _corpus(tmp_path, icml_rows[:200])
    store = tmp_path / "store"
    run = procs.ingest(corpus, "--no-corpus", "--store", store)
    _wait_until(lambda: _committed(store) > 0, "the first batch is committed", run)
    hash_embedder.hold_batches(2)
    ended: list[float] = []

    def watch() -> None:
        while run.running():
            time.sleep(0.02)
        ended.append(time.time())

    titles = [papers[pid]["title"] for pid in list(papers)[::7]]
    query_modes = [(t, m) for t, m in zip(titles, itertools.cycle(["hybrid", "dense", "bm25"]))]

    def searcher(queries: list[tuple[str, str]]) -> list:
        return run_cli_batch(
            *(_search_cmd(store, query, mode) for query, mode in queries),
            while_pid=run.proc.pid,
            pause=0.5,
            timeout=900,
        )

    with ThreadPoolExecutor(3) as pool:
        watcher = pool.submit(watch)
        # The two searchers ask different titles, in a different order of modes.
        searches = [
            proc
            for batch in pool.map(searcher, [query_modes[::2], query_modes[1::2]])
            for proc in batch
        ]
        watcher.result()
    rc, out, err = run.wait()
    [last] = run_cli_batch(_search_cmd(store, *query_modes[0]))
    failures = []
    for proc in [*searches, last]:
        try:
            _search_ids(store, proc)
        except AssertionError as exc:
            failures.append(str(exc))
    during = sum(proc.started < ended[0] for proc in searches)
    print(
        f"{during} searches ran during the ingest ({len(searches)} in all), {len(failures)} failed"
    )
    assert during >= 4, "the ingest finished before the searches could overlap it"
    assert not failures, (
        f"{len(failures)} of {len(searches) + 1} searches failed; first: {failures[0]}"
    )
    assert rc == 0 and "Traceback" not in err, err
    assert _new_papers(out) == len(papers)
    _check_complete(store, papers)


# ---- 5: a store from another version or another model ------------------------------------------


def _copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    with contextlib.closing(sqlite3.connect(dst / "papers.sqlite")) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # a cleanly closed store: no -wal left
    return dst


def _set_meta(store: Path, key: str, value: str) -> None:
    with contextlib.closing(sqlite3.connect(store / "papers.sqlite", isolation_level=None)) as db:
        assert db.execute("UPDATE meta SET value=? WHERE key=?", (value, key)).rowcount == 1


def test_old_schema_store_is_refused_with_the_rebuild_command(tmp_path, seed_store, small_corpus):
    store = _copy_store(seed_store, tmp_path / "old")
    _set_meta(store, "schema_version", "0")
    # The three refused commands share one process (tests/cli_batch.py): each opens the store anew.
    refused = run_cli_batch(
        *(
            [*args, "--store", str(store)]
            for args in (
                ["ask", "How does Palimpsa relate to Mamba2?"],
                ["search", "Palimpsa"],
                ["ingest", str(small_corpus)],
            )
        )
    )
    for proc in refused:
        assert proc.returncode == 1, (proc.args, proc.stdout, proc.stderr)
        _one_line_error(proc.stderr, r"schema version 0", r"rag ingest --rebuild")
        assert proc.stdout == ""
    with _ro(store / "papers.sqlite") as db:
        assert db.execute("SELECT COUNT(DISTINCT paper_id) FROM chunks").fetchone()[0] == 76
    # The advice works.
    proc = run_cli("ingest", "--rebuild", "--no-corpus", str(small_corpus), "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    proc, stats_proc = run_cli_batch(
        ["ask", "sparse mixture of experts routing", "--json", "--store", str(store)],
        _stats_cmd(store),
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(stats_proc.stdout)
    assert (stats["papers"], stats["schema_version"]) == (3, 1)


def test_stats_reports_the_schema_version_the_store_has(tmp_path, seed_store):
    """`rag stats` is where one looks when a store is refused: it must show the store's version."""
    store = _copy_store(seed_store, tmp_path / "old")
    _set_meta(store, "schema_version", "0")
    proc = run_cli("stats", "--json", "--store", str(store))
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        assert json.loads(proc.stdout)["schema_version"] == 0, (
            f"rag stats reports schema_version {json.loads(proc.stdout)['schema_version']} for a"
            " store whose meta.schema_version is 0"
        )
    else:
        _one_line_error(proc.stderr, "schema version 0")


def test_store_built_with_another_embedding_model_is_refused(tmp_path, seed_store):
    store = _copy_store(seed_store, tmp_path / "other-model")
    _set_meta(store, "embedding_model", "sentence-transformers/all-mpnet-base-v2")
    proc = run_cli("ask", "How does Palimpsa relate to Mamba2?", "--store", str(store))
    assert proc.returncode == 1, proc.stdout
    # The fix keeps the papers: a repair re-indexes what the store holds (never a rebuild from
    # corpus files).
    _one_line_error(
        proc.stderr, "all-mpnet-base-v2", r"RAG_EMBED_MODEL=minilm-l6-ml-v1 rag repair --store"
    )
    # And the other way round: this store, asked with another configured model.
    proc = run_cli(
        "search",
        "Palimpsa",
        "--store",
        str(_copy_store(seed_store, tmp_path / "minilm")),
        env={"RAG_EMBED_MODEL": "openai:text-embedding-3-small"},
    )
    assert proc.returncode == 1, proc.stdout
    _one_line_error(
        proc.stderr, "minilm-l6-ml-v1", r"RAG_EMBED_MODEL=openai:text-embedding-3-small rag repair"
    )


# ---- 6: a read-only store ----------------------------------------------------------------------


def _tree_digest(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_mode, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    } | {".": (root.stat().st_mode, "")}


@pytest.fixture
def read_only_store(tmp_path, seed_store):
    """A copy of the seed store owned by root, every directory 0555 and file 0444, and a way to
    run `rag` as nobody against it."""
    _require(os.geteuid() == 0, "needs root to drop to nobody with setpriv")
    _require(shutil.which("setpriv") is not None, "setpriv (util-linux) is not installed")
    store = _copy_store(seed_store, tmp_path / "ro")
    home = tmp_path / "nobody-home"
    home.mkdir()
    os.chown(home, pwd_uid("nobody"), -1)
    for p in [store, *store.rglob("*")]:
        os.chown(p, 0, 0)
        p.chmod(0o555 if p.is_dir() else 0o444)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(home)}

    def as_nobody(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*NOBODY, *argv], capture_output=True, text=True, env=env, timeout=300, check=False
        )

    probe = as_nobody(sys.executable, "-c", "import os; print(os.geteuid())")
    _require(
        probe.returncode == 0 and probe.stdout.strip() == str(pwd_uid("nobody")),
        f"cannot run Python as nobody with setpriv: {probe.stderr.strip()[-500:]}",
    )
    probe = as_nobody(sys.executable, "-c", f"open({str(store / 'probe')!r}, 'w')")
    assert "PermissionError" in probe.stderr, (
        f"{store} is writable for nobody: the test would prove nothing"
    )
    try:
        yield store, as_nobody
    finally:
        for p in [store, *store.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)


def pwd_uid(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def test_ingest_into_a_read_only_store_is_one_line_and_leaves_it_intact(
    tmp_path, read_only_store, small_corpus
):
    store, as_nobody = read_only_store
    before = _tree_digest(store)
    proc = as_nobody(RAG_EXE, "ingest", str(small_corpus), "--store", str(store))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    _one_line_error(proc.stderr, re.escape(str(store)), r"permission|read-only|not writable")
    assert _tree_digest(store) == before, "the refused ingest changed the store"
    # The index is intact: a copy of it (root would write -wal/-shm into the original) answers.
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    for p in [copy, *copy.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    assert _check_search(copy, "How does Palimpsa relate to Mamba2?")[0] == "wKMV7mXjUr"


def test_a_read_only_store_reports_clearly_and_stays_intact(read_only_store):
    """The manifest opens read-only (stats work); embedded Chroma (1.5) cannot open a read-only
    directory at all, so a search answers from the keyword index and says so in one line."""
    store, as_nobody = read_only_store
    before = _tree_digest(store)
    stats = as_nobody(RAG_EXE, "stats", "--json", "--store", str(store))
    search = as_nobody(
        RAG_EXE, "search", "How does Palimpsa relate to Mamba2?", "--json", "--store", str(store)
    )
    assert _tree_digest(store) == before
    assert stats.returncode == 0, (
        f"rag stats as nobody on a read-only store: {stats.stderr.strip()}"
    )
    assert json.loads(stats.stdout)["papers"] == 76
    # Questions need not write: keyword retrieval answers, and one line says why it is keywords
    # only.
    assert search.returncode == 0, search.stderr
    assert json.loads(search.stdout)["results"][0]["paper_id"] == "wKMV7mXjUr"
    lines = search.stderr.strip().splitlines()
    assert len(lines) == 1 and "read-only" in lines[0] and "keyword retrieval only" in lines[0], (
        search.stderr
    )
    doctor = as_nobody(RAG_EXE, "doctor", "--store", str(store))
    assert "rebuild" not in doctor.stdout and "copy it to a writable place" in doctor.stdout, (
        doctor.stdout
    )
    assert _tree_digest(store) == before


def test_rag_map_of_a_read_only_store_says_why_in_one_line(read_only_store, tmp_path):
    """No cached map and Chroma cannot open read-only: one line that says what to do; nothing
    written."""
    store, as_nobody = read_only_store
    (store / "map.npz").unlink()  # the seed store's cached map (root may, in a 0555 directory)
    before = _tree_digest(store)
    out = tmp_path / "nobody-home" / "map.html"  # the fixture's home for nobody: writable
    proc = as_nobody(RAG_EXE, "map", "--store", str(store), "--out", str(out))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    _one_line_error(proc.stderr, re.escape(str(store)), r"read-only")
    assert _tree_digest(store) == before and not out.exists()


# ---- 7: a full disk ----------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path, procs):
    """A 32 MB tmpfs; the test fills it with junk at the moment it chooses."""
    _require(os.geteuid() == 0, "needs root to mount a tmpfs")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    _require(proc.returncode == 0, f"cannot mount a tmpfs: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        procs.kill_all()
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path, leave: int = 0) -> Path:
    """Fill the file system with junk, leaving about `leave` bytes free."""
    junk = mnt / "junk"
    with open(junk, "ab", buffering=0) as fh:
        st = os.statvfs(mnt)
        free = st.f_bavail * st.f_frsize - leave
        with contextlib.suppress(OSError):
            fh.write(b"\0" * max(free, 0))
        if leave == 0:
            for size in (1 << 16, 4096, 1):
                while True:
                    try:
                        fh.write(b"\0" * size)
                    except OSError as exc:
                        assert exc.errno == errno.ENOSPC, exc
                        break
    return junk


@pytest.mark.parametrize("where", ["vectors", "manifest", "keyword"])
def test_full_disk_fails_in_one_line_and_the_store_recovers(
    tmp_path, icml_rows, procs, small_disk, where, hash_embedder
):
    """The disk fills while Chroma writes a batch's vectors, while the manifest commits a batch, or
    while the keyword index is saved; free the space and re-run. Uses the hashing embedder (384
    dimensions, as the bundled model: the same bytes to write): what is asserted is the error and
    the recovery, not retrieval quality."""
    # Two full batches and one paper. The vectors and manifest faults land in the second batch: its
    # 64 papers take seconds to embed, so the first commit is seen, and the disk filled, before it
    # is written. The keyword index of 129 papers does not fit in the 128 KB left for it either (the
    # test checks that the keyword save is what failed). batches of 64: 64, 64, 1
    corpus, papers = _corpus(tmp_path, icml_rows[: 2 * PAPERS_PER_BATCH + 1])
    store = small_disk / "store"
    run = procs.ingest(corpus, "--no-corpus", "--store", store)
    if where == "vectors":
        _wait_until(lambda: _committed(store) >= 64, "the first batch is committed", run)
        _fill(small_disk)  # the next write is the next batch's vectors
    elif where == "manifest":
        _wait_until(lambda: _committed(store) >= 64, "64 papers are committed", run)
        with _manifest_write_lock(store):
            before = _chroma_rows(store)
            _wait_until(
                lambda: _chroma_rows(store) > before,
                "the next batch's vectors are written",
                run,
                timeout=180,
            )
            _fill(small_disk, leave=0)  # the commit finds no space
    else:
        # The pipelined ingest commits its last batch right after the one before: too fast to stop
        # between them from outside. The keyword save is reached deterministically by the repair
        # path instead: a complete store whose keyword index is missing, re-ingested on a disk with
        # room for SQLite's files (128 KB) but not for the index (~300 KB).
        rc, _, err = run.wait()
        assert rc == 0, err
        (store / "keyword.json").unlink()
        shutil.rmtree(store / "keyword")
        _fill(small_disk, leave=128 * 1024)
        run = procs.ingest(corpus, "--no-corpus", "--store", store)
    rc, out, err = run.wait()
    problems = []

    def soft(check, *args):
        try:
            return check(*args)
        except AssertionError as exc:
            problems.append(str(exc))

    if rc != 1:
        problems.append(f"the ingest on a full disk exited {rc}, not 1")
    soft(_one_line_error, err, r"space|disk is full|disk full")
    print(f"disk full at {where}: exit {rc}; stderr ends with: {err.strip().splitlines()[-1]}")
    state = _check_manifest(store, papers)
    if where == "keyword":
        assert state["ids"] == set(papers) and "keyword index" in err, (
            "the disk filled before the keyword save"
        )
    else:
        assert 0 < state["papers"] < len(papers)
    # While the disk is still full, reading the index works, or fails saying the disk is full.
    proc = run_cli("search", "reinforcement learning", "--store", str(store))
    if proc.returncode != 0:
        soft(_one_line_error, proc.stderr, r"space|disk is full|disk full")

    (small_disk / "junk").unlink()
    title = next(papers[pid]["title"] for pid in papers if pid in state["ids"])
    stats, *found = run_cli_batch(
        _stats_cmd(store), *(_search_cmd(store, title, mode) for mode in ("hybrid", "bm25"))
    )
    _stats_match(stats, state)
    for proc in found:
        soft(_search_ids, store, proc)
    rc, out, err = procs.ingest(corpus, "--no-corpus", "--store", store).wait()
    assert rc == 0 and "Traceback" not in err, err
    assert _new_papers(out) + state["papers"] == len(papers), out
    soft(_check_complete, store, papers)
    assert not problems, "\n".join(problems)
