"""Server mode: vectors on a real `chroma run` server (RAG_CHROMA_URL), the rest in the store
dir."""

from __future__ import annotations

import json

import pytest

from rag import RAG
from tests.cli_batch import run_cli_batch
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it


def test_ingest_and_search_against_a_chroma_server(tmp_path, small_corpus, chroma_server):
    rag = RAG(
        store_dir=tmp_path / "store",
        chroma_url=chroma_server.url,
        collection="server_papers",
        llm="none",
    )
    report = rag.ingest([small_corpus], include_corpus=False)
    assert report.new_papers == 3
    assert not (tmp_path / "store/chroma").exists()  # no embedded Chroma: vectors are on the server
    assert rag.search("protein structure diffusion", k=1, mode="dense")[0].paper_id == "BBBBBBBBB2"
    assert "server_papers" in rag.stats()["store"]

    import chromadb

    client = chromadb.HttpClient(host=chroma_server.host, port=chroma_server.port)
    assert client.get_collection("server_papers").count() == 4
    # `chroma run` refuses Chroma's sparse index: the collection was made without it, keywords rank
    # here.
    assert "rag_bm25" not in client.get_collection("server_papers").schema.keys
    assert not rag.store.server_keyword_search()

    # The CLI picks the server up from the environment, and --rebuild empties it. (Both commands in
    # one fresh process, tests/cli_batch.py: each is `rag.cli.main` with Chroma's client cache
    # dropped before it.)
    env = {"RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": "server_papers"}
    store = str(tmp_path / "store")
    proc, rebuild = run_cli_batch(
        ["search", "sparse mixture routing", "--json", "--store", store],
        ["ingest", str(small_corpus), "--rebuild", "--no-corpus", "--store", store],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["paper_id"] == "AAAAAAAAA1"
    assert rebuild.returncode == 0, rebuild.stderr
    # all of them again: it was emptied
    assert rebuild.stdout.startswith("indexed 3 new papers"), rebuild.stdout
    assert client.get_collection("server_papers").count() == 4


def test_unreachable_chroma_server_is_a_clear_error(tmp_path, small_corpus):
    from tests.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    proc = run_cli(
        "ingest",
        str(small_corpus),
        "--no-corpus",
        "--store",
        str(tmp_path / "s"),
        env={"RAG_CHROMA_URL": url},
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith(f"rag: error: cannot reach Chroma at {url}")


def _count(chroma_server, name: str) -> int:
    import chromadb

    return (
        chromadb.HttpClient(host=chroma_server.host, port=chroma_server.port)
        .get_collection(name)
        .count()
    )


def _collection_of(stats_json: str) -> str:
    location = json.loads(stats_json)["store"]
    return location.rsplit("collection ", 1)[1].rstrip(")")


def test_two_stores_on_one_server_keep_to_their_own_collections(
    tmp_path, small_corpus, chroma_server
):
    """Two stores pointed at one server with no RAG_COLLECTION get a collection each (recorded in
    the store), so one's --rebuild cannot touch the other's vectors."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    other = other_paper(tmp_path)
    env = {"RAG_CHROMA_URL": chroma_server.url}
    runs = run_cli_batch(
        ["ingest", str(small_corpus), "--no-corpus", "--store", a],
        ["ingest", str(other), "--no-corpus", "--store", b],
        ["stats", "--json", "--store", a],
        ["stats", "--json", "--store", b],
        ["ingest", str(other), "--rebuild", "--no-corpus", "--store", b],
        ["search", "sparse mixture routing", "--json", "--store", a],
        env=env,
    )
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    name_a, name_b = _collection_of(runs[2].stdout), _collection_of(runs[3].stdout)
    assert name_a != name_b and name_a.startswith("papers-a-") and name_b.startswith("papers-b-")
    assert _count(chroma_server, name_a) == 4  # B's rebuild left A's vectors alone
    assert _count(chroma_server, name_b) == 1
    assert json.loads(runs[5].stdout)["results"][0]["paper_id"] == "AAAAAAAAA1"
    assert "warning" not in runs[5].stderr


def test_a_rebuild_of_a_shared_collection_asks_first_and_the_other_store_follows(
    tmp_path, small_corpus, chroma_server
):
    """Two stores sharing one collection on purpose: B's --rebuild refuses (one line naming A and
    --yes) and deletes nothing; with --yes it rebuilds, and A's next question says so in one line
    and answers from the rebuilt corpus (its caches follow the server), never from the papers that
    are gone."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    env = {"RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": "shared-corpus"}
    ingest_a, ingest_b, refused = run_cli_batch(
        ["ingest", str(small_corpus), "--no-corpus", "--store", a],
        ["ingest", str(small_corpus), "--no-corpus", "--store", b],
        ["ingest", str(small_corpus), "--rebuild", "--no-corpus", "--store", b],
        env=env,
    )
    assert ingest_a.returncode == 0 and ingest_b.returncode == 0, (ingest_a.stderr, ingest_b.stderr)
    # B took A's papers from the server
    assert ingest_b.stdout.startswith("nothing new to index"), ingest_b.stdout
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr
    assert (
        "'shared-corpus' is shared" in lines[0]
        and str(tmp_path / "a") in lines[0]
        and "--yes" in lines[0]
    )
    assert _count(chroma_server, "shared-corpus") == 4

    rebuilt, search_a, stats_a = run_cli_batch(
        ["ingest", str(other_paper(tmp_path)), "--rebuild", "--yes", "--no-corpus", "--store", b],
        ["search", "sparse mixture routing", "--json", "--store", a],
        ["stats", "--json", "--store", a],
        env=env,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert _count(chroma_server, "shared-corpus") == 1
    assert search_a.returncode == 0, search_a.stderr
    assert (
        "was replaced on the server" in search_a.stderr
        and len(search_a.stderr.strip().splitlines()) == 1
    )
    assert {r["paper_id"] for r in json.loads(search_a.stdout)["results"]} == {"DDDDDDDDD4"}
    assert json.loads(stats_a.stdout)["papers"] == 1


def other_paper(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "DDDDDDDDD4",
                "title": "Kernel Ridge Regression at Scale",
                "abstract": "We scale kernel ridge regression to a billion points with sketching.",
                "authors": ["Emmy Noether"],
                "url": "https://openreview.net/forum?id=DDDDDDDDD4",
                "venue": "ICML 2026",
                "year": "2026",
            }
        )
        + "\n"
    )
    return path


def test_a_replica_starting_empty_builds_its_caches_and_a_stale_one_catches_up(
    tmp_path, small_corpus, chroma_server
):
    """The server is the corpus: a store directory that starts empty answers from a collection
    another store filled (papers, metadata, keyword and dense retrieval), and a store whose caches
    fall behind adds only what it lacks on its next question."""
    a, b = tmp_path / "a", tmp_path / "b"
    shared = {"chroma_url": chroma_server.url, "collection": "replica-corpus", "llm": "none"}
    first = RAG(store_dir=a, **shared)
    first.ingest([small_corpus], include_corpus=False)

    second = RAG(store_dir=b, **shared)  # b/ does not exist yet
    assert (
        second.search("protein structure diffusion", k=1, mode="bm25")[0].paper_id == "BBBBBBBBB2"
    )
    assert (
        second.search("protein structure diffusion", k=1, mode="dense")[0].paper_id == "BBBBBBBBB2"
    )
    assert (
        second.caught_up is not None
        and second.caught_up.abstracts == 4
        and not second.caught_up.rebuilt
    )
    # four abstracts: AAAAAAAAA1 has two
    assert second.stats()["papers"] == first.stats()["papers"] == 3
    assert [p.authors for p in second.papers("BBBBBBBBB2")] == [["Alan Turing", "Grace Hopper"]]
    assert second.store.chunk_ids() == first.store.chunk_ids()

    second.ingest([other_paper(tmp_path)], include_corpus=False)
    hits = first.search("kernel ridge regression sketching", k=1)  # first's next question
    assert hits[0].paper_id == "DDDDDDDDD4" and hits[0].title == "Kernel Ridge Regression at Scale"
    assert first.caught_up.abstracts == 1  # only the new paper was fetched
    assert [(p.venue, p.year) for p in first.papers("DDDDDDDDD4")] == [("ICML 2026", "2026")]
    assert first.store.chunk_ids() == second.store.chunk_ids()


def test_a_store_built_on_a_server_before_names_were_recorded_keeps_papers(
    tmp_path, small_corpus, chroma_server
):
    import sqlite3

    store = tmp_path / "legacy"
    rag = RAG(store_dir=store, chroma_url=chroma_server.url, collection="papers", llm="none")
    rag.ingest([small_corpus], include_corpus=False)
    rag.store.close()
    with sqlite3.connect(store / "papers.sqlite") as db:
        db.execute("DELETE FROM meta WHERE key='collection'")
    reopened = RAG(store_dir=store, chroma_url=chroma_server.url, llm="none")
    assert reopened.store.collection_name == "papers"
    assert (
        reopened.search("protein structure diffusion", k=1, mode="dense")[0].paper_id
        == "BBBBBBBBB2"
    )


def test_a_bad_collection_name_is_one_line(tmp_path, small_corpus):
    proc = run_cli(
        "ingest",
        str(small_corpus),
        "--no-corpus",
        "--store",
        str(tmp_path / "s"),
        "--collection",
        "a b",
    )
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "collection" in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_two_stores_ingesting_into_one_collection_at_once_lose_nothing(tmp_path, chroma_server):
    """Ingest is idempotent by chunk id (paper, abstract hash, position), so two stores writing into
    one collection at the same moment converge: the server holds both sets once, and each store's
    next question sees the other's papers. Both orders of starting."""
    import os
    import subprocess
    import sys

    from tests.conftest import write_jsonl

    def papers(prefix: str, n: int, topic: str) -> list[dict]:
        return [
            {
                "id": f"{prefix}{i:08d}",
                "title": f"{topic} study {i}",
                "abstract": (
                    f"We study {topic} in setting number {i} and report gains on {n} benchmarks."
                ),
            }
            for i in range(n)
        ]

    for order, name in (((0, 1), "at-once-ab"), ((1, 0), "at-once-ba")):
        files = [
            write_jsonl(tmp_path / f"{name}-{i}.jsonl", papers(p, 40, t))
            for i, (p, t) in enumerate((("A", "graph coloring"), ("B", "protein docking")))
        ]
        stores = [tmp_path / f"{name}-store-{i}" for i in range(2)]
        env = {**os.environ, "RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": name}
        procs = {}
        for i in order:
            procs[i] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rag",
                    "ingest",
                    str(files[i]),
                    "--no-corpus",
                    "--store",
                    str(stores[i]),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        for i in order:
            out, err = procs[i].communicate(timeout=300)
            assert procs[i].returncode == 0, err
        assert _count(chroma_server, name) == 80
        for i in range(2):
            rag = RAG(
                store_dir=stores[i], chroma_url=chroma_server.url, collection=name, llm="none"
            )
            assert rag.stats()["papers"] == 80
            assert (
                rag.search("protein docking study 7", k=1, mode="bm25")[0].paper_id == "B00000007"
            )
            assert rag.search("graph coloring study 7", k=1, mode="bm25")[0].paper_id == "A00000007"


def test_a_chroma_server_killed_mid_ingest_then_restarted_resumes_without_duplicates(
    tmp_path, chroma_server_factory
):
    """The server SIGKILLed after the ingest's first batch is committed: the ingest fails in one
    line; the server restarted on its data, the same command resumes, and the corpus ends whole and
    once: the collection holds exactly the manifest's chunks, and an empty store built from the
    server agrees."""
    import os
    import sqlite3
    import subprocess
    import sys
    import time

    from tests.conftest import icml_rows, write_jsonl

    rows = icml_rows(256)
    corpus = write_jsonl(tmp_path / "icml256.jsonl", rows)
    store = tmp_path / "store"
    server = chroma_server_factory(tmp_path / "chroma")
    argv = [
        sys.executable,
        "-m",
        "rag",
        "ingest",
        str(corpus),
        "--no-corpus",
        "--store",
        str(store),
    ]
    env = {**os.environ, "RAG_COLLECTION": "restart-corpus"}
    proc = subprocess.Popen(
        argv,
        env={**env, "RAG_CHROMA_URL": server.url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def committed() -> int:
        try:
            with sqlite3.connect(f"file:{store / 'papers.sqlite'}?mode=ro", uri=True) as db:
                return db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 240
    while committed() == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    server.proc.kill()
    server.proc.wait()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err  # killed mid-way, not after the last batch
    # progress lines
    said = [line for line in err.strip().splitlines() if not line.startswith("rag: ingest: ")]
    assert len(said) == 1 and "Traceback" not in err and "run the ingest again" in said[0], err
    partial = committed()
    assert 0 < partial

    restarted = chroma_server_factory(tmp_path / "chroma")
    rerun = subprocess.run(
        argv,
        env={**env, "RAG_CHROMA_URL": restarted.url},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert rerun.returncode == 0, rerun.stderr
    rag = RAG(store_dir=store, chroma_url=restarted.url, collection="restart-corpus", llm="none")
    chunks = rag.store.chunk_count()
    assert chunks > partial and rag.stats()["papers"] == sum(bool(r.get("abstract")) for r in rows)
    assert _count(restarted, "restart-corpus") == chunks  # every chunk once, no orphan left behind
    fresh = RAG(
        store_dir=tmp_path / "fresh",
        chroma_url=restarted.url,
        collection="restart-corpus",
        llm="none",
    )
    assert fresh.stats()["papers"] == rag.stats()["papers"]
    assert fresh.store.chunk_ids() == rag.store.chunk_ids()


def test_doctor_on_an_empty_replica_builds_its_caches_and_names_the_collection(
    tmp_path, small_corpus, chroma_server
):
    shared = {"RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": "doctor-corpus"}
    ingest, doctor = run_cli_batch(
        ["ingest", str(small_corpus), "--no-corpus", "--store", str(tmp_path / "a")],
        ["doctor", "--store", str(tmp_path / "empty")],
        env=shared,
    )
    assert ingest.returncode == 0, ingest.stderr
    assert "3 papers, 4 chunks" in doctor.stdout, doctor.stdout
    assert "4 vectors, one per chunk in collection 'doctor-corpus'" in doctor.stdout
    assert "keywords are ranked here (the server has no sparse index" in doctor.stdout


class _SparseServerCollection:
    """A fake: a real `chroma run` collection seen through a proxy that claims Chroma's sparse index
    and answers `search` from a script, standing in for the distributed deployment this machine
    cannot run. What is asserted is the plumbing (the request sent, the ranking used, the fallback),
    not Chroma's BM25."""

    def __init__(self, real, answer):
        self._real, self._answer, self.requests = real, answer, []
        from rag.index.vectors import sparse_schema

        self.schema = sparse_schema()

    def __getattr__(self, name):
        return getattr(self._real, name)

    def search(self, request):
        self.requests.append(request.to_dict())
        return self._answer(request)


def test_keywords_are_ranked_on_a_server_with_a_sparse_index_and_locally_when_it_fails(
    tmp_path, small_corpus, chroma_server
):
    from rag.testing import HashEmbedder

    rag = RAG(
        store_dir=tmp_path / "s",
        chroma_url=chroma_server.url,
        collection="sparse-plumbing",
        llm="none",
        embedder=HashEmbedder(),
    )
    rag.ingest([small_corpus], include_corpus=False)
    local = [h.paper_id for h in rag.search("sparse mixture routing", k=3, mode="bm25")]
    assert local[0] == "AAAAAAAAA1"
    real = rag.store.collection()
    ids = sorted(real.get(include=[])["ids"])
    theirs = [i for i in ids if not i.startswith("AAAAAAAAA1")] + [
        i for i in ids if i.startswith("AAAAAAAAA1")
    ]
    proxy = _SparseServerCollection(
        real, lambda request: {"ids": [theirs], "scores": [[-9.0, -5.0, -2.0, -1.0]]}
    )
    rag.store.vector_index._collection = proxy
    assert rag.store.server_keyword_search()
    on_server = rag.search("sparse mixture routing", k=4, mode="bm25")
    assert [h.paper_id for h in on_server] == list(dict.fromkeys(i.split(":")[0] for i in theirs))
    assert on_server[0].retrieval.keyword == 9.0  # the server's score, made positive
    knn = proxy.requests[0]["rank"]["$knn"]
    assert knn["query"] == "sparse mixture routing" and knn["key"] == "rag_bm25"

    def refuse(request):
        raise RuntimeError("Search operation is not implemented for local executor")

    proxy._answer = refuse
    assert [h.paper_id for h in rag.search("sparse mixture routing", k=3, mode="bm25")] == local
    # the failure is remembered: no request per question
    assert not rag.store.server_keyword_search()
    assert "not implemented" in rag.store.sparse_unavailable


def test_at_a_terminal_a_rebuild_of_a_shared_collection_asks(tmp_path, small_corpus, chroma_server):
    """With a terminal on stdin the refusal becomes a question: "n" (or nothing) keeps everything,
    "y" rebuilds."""
    import os
    import pty
    import subprocess
    import sys

    env = {**os.environ, "RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": "asked-corpus"}
    first, second = run_cli_batch(
        ["ingest", str(small_corpus), "--no-corpus", "--store", str(tmp_path / "a")],
        ["ingest", str(small_corpus), "--no-corpus", "--store", str(tmp_path / "b")],
        env=env,
    )
    assert first.returncode == 0 and second.returncode == 0
    argv = [
        sys.executable,
        "-m",
        "rag",
        "ingest",
        str(other_paper(tmp_path)),
        "--rebuild",
        "--no-corpus",
        "--store",
        str(tmp_path / "b"),
    ]
    for answer, code, left in (("n", 1, 4), ("y", 0, 1)):
        controller, terminal = pty.openpty()
        os.write(controller, f"{answer}\n".encode())
        proc = subprocess.run(
            argv, env=env, stdin=terminal, capture_output=True, text=True, timeout=300
        )
        os.close(controller)
        os.close(terminal)
        assert proc.returncode == code, proc.stderr
        assert "Rebuild the shared collection? [y/N]" in proc.stdout + proc.stderr
        assert _count(chroma_server, "asked-corpus") == left


def test_healthz_of_an_empty_replica_counts_the_corpus_on_the_server(
    tmp_path, small_corpus, chroma_server
):
    from starlette.testclient import TestClient

    from rag.serve.http import make_app

    shared = {"chroma_url": chroma_server.url, "collection": "healthz-corpus", "llm": "none"}
    RAG(store_dir=tmp_path / "a", **shared).ingest([small_corpus], include_corpus=False)
    with TestClient(make_app(RAG(store_dir=tmp_path / "empty", **shared), mcp=False)) as client:
        assert client.get("/healthz").json() == {"status": "ok", "papers": 3}


def test_a_replica_started_before_any_paper_is_on_the_server_serves_once_an_ingest_fills_it(
    tmp_path, small_corpus, chroma_server
):
    """A new deployment starts its replicas and the server together: `rag serve` on an empty
    collection starts (not ready: /healthz 503, a question gets one line naming the collection) and
    answers after an ingest."""
    import os
    import sys
    import time
    import urllib.error
    import urllib.request

    from tests.harness import log_tail, popen_logged, stop_process
    from tests.servers import free_port

    port = free_port()
    env = {
        **os.environ,
        "RAG_CHROMA_URL": chroma_server.url,
        "RAG_COLLECTION": "late-corpus",
        "RAG_LLM": "none",
    }
    log = tmp_path / "serve.log"
    proc = popen_logged(
        [
            sys.executable,
            "-m",
            "rag",
            "serve",
            "--store",
            str(tmp_path / "replica"),
            "--port",
            str(port),
        ],
        log,
        env,
        tmp_path,
    )

    def get(path: str, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=data,
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        deadline = time.monotonic() + 120
        while "OpenAI-compatible API on" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_tail(log)
            time.sleep(0.2)
        assert "no papers yet in Chroma collection 'late-corpus'" in log.read_text()
        status, health = get("/healthz")
        assert status == 503 and health["papers"] == 0 and "late-corpus" in health["message"]
        status, error = get("/v1/search", {"query": "sparse mixture routing"})
        assert (
            status == 503
            and "no papers yet in Chroma collection 'late-corpus'" in error["error"]["message"]
        )

        RAG(
            store_dir=tmp_path / "writer",
            chroma_url=chroma_server.url,
            collection="late-corpus",
            llm="none",
        ).ingest([small_corpus], include_corpus=False)
        assert get("/healthz") == (200, {"status": "ok", "papers": 3})
        status, found = get("/v1/search", {"query": "sparse mixture routing", "k": 1})
        assert status == 200 and found["results"][0]["paper_id"] == "AAAAAAAAA1"
    finally:
        stop_process(proc)
