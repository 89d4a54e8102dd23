"""A shared Chroma server is untrusted input (issue 50, items 1-3 and 8-10): a real `chroma run` on
loopback, written to directly with chromadb as any client of it could, and the stores that share its
collection. Plumbing only, so the stores embed with `rag.testing.HashEmbedder` where no `rag`
command runs in a process of its own."""

from __future__ import annotations

import hashlib
import json
import shutil
import time

import pytest

import rag.index.vectors as vectors
from rag import RAG
from rag.errors import StoreError
from rag.testing import HashEmbedder
from tests.cli_batch import run_cli_batch
from tests.faultproxy import fault_proxy

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

COLLECTION = "shared"  # each test's own (the server is the session's): see `own_collection`


@pytest.fixture(autouse=True)
def own_collection(request):
    """A collection name of this test's own on the session's Chroma server."""
    global COLLECTION
    COLLECTION = "shared-" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]


def _store(path, url: str, **kw) -> RAG:
    return RAG(
        store_dir=path, chroma_url=url, collection=COLLECTION, llm="none",
        embedder=HashEmbedder(), **kw,
    )  # fmt: skip


def _collection(server, name: str | None = None):
    import chromadb

    client = chromadb.HttpClient(host=server.host, port=server.port)
    return client.get_collection(name or COLLECTION)


def _client(server):
    import chromadb

    return chromadb.HttpClient(host=server.host, port=server.port)


def _plant(server, cid: str, meta: dict, document: str = "t") -> None:
    """Write one record as any client of the server could (a vector copied from a real one)."""
    col = _collection(server)
    v = col.get(limit=1, include=["embeddings"])["embeddings"][0]
    col.upsert(ids=[cid], embeddings=[v], documents=[document], metadatas=[meta])


def _head(pid: str, abstract: str, **kw) -> tuple[str, dict]:
    from rag.index.chunking import abstract_hash

    h = abstract_hash(abstract)
    meta = {"paper_id": pid, "abstract_hash": h, "seq": 0, "n_chunks": 1, "abstract": abstract}
    meta.update(kw)
    return f"{pid}:{h}:0", meta


@pytest.fixture
def writer(tmp_path, small_corpus, chroma_server) -> RAG:
    """Store A, which ingested the small corpus (3 papers, 4 abstracts) into the shared
    collection."""
    a = _store(tmp_path / "a", chroma_server.url)
    a.ingest([small_corpus], include_corpus=False)
    return a


# ---- item 1: malformed records -------------------------------------------------------------


def test_malformed_records_are_skipped_and_named_and_every_other_paper_answers(
    tmp_path, writer, chroma_server
):
    """`seq: "zero"`, `n_chunks: "one"`, and `n_chunks: 2` with chunks 0 and 7 crashed every
    replica (ValueError, KeyError: 1). Now each is skipped, named once, and the papers answer."""
    _plant(chroma_server, "x:0123456789ab:0", {"paper_id": "x", "abstract_hash": "0123456789ab",
           "seq": "zero", "n_chunks": 1, "abstract": "t", "title": "T"})  # fmt: skip
    cid, meta = _head("y", "An abstract about nothing.", title="Y")
    _plant(chroma_server, cid, {**meta, "n_chunks": "one"})
    cid, meta = _head("z", "Another abstract about nothing at all.", title="Z")
    _plant(chroma_server, cid, {**meta, "n_chunks": 2})
    _plant(chroma_server, cid[:-1] + "7", {**meta, "seq": 7})
    for rag in (_store(tmp_path / "fresh", chroma_server.url), writer):  # fresh and stale
        hits = rag.search("protein structure diffusion", k=3)
        assert hits[0].paper_id == "BBBBBBBBB2"
        assert rag.stats()["papers"] == 3
        skipped = " ".join(rag.caught_up.skipped)
        assert "x:0123456789ab:0" in skipped and "y:" in skipped and "z:" in skipped
        assert len(rag.caught_up.skipped) == 3


def test_a_reply_that_is_not_chromas_is_one_line_and_the_caches_answer(
    tmp_path, writer, chroma_server
):
    """Garbage or wrong-shaped JSON during a catch-up gave orjson / AttributeError tracebacks."""
    with fault_proxy(chroma_server.url, match="/get") as proxy:
        fresh = _store(tmp_path / "fresh", proxy.url)
        proxy.reply(b"<html>not json", times=None)
        with pytest.raises(StoreError, match="cannot reach Chroma"):
            fresh.search("protein", k=1)  # no caches yet: one line, not a traceback
        proxy.clear()
        proxy.reply(json.dumps({"ids": {"a": 1}, "metadatas": 7}).encode(), times=None)
        stale = _store(tmp_path / "a", proxy.url)  # A's caches, through the proxy
        _plant(chroma_server, *_head("n", "A new paper on the server.", title="N"))
        hits = stale.search("protein structure diffusion", k=1)
        assert hits[0].paper_id == "BBBBBBBBB2"  # answered from its caches
        assert "cannot reach Chroma" in (stale.store.vectors_unavailable or "")


# ---- item 3: timeouts ----------------------------------------------------------------------


def test_a_server_that_holds_its_replies_times_out_and_the_caches_answer(
    writer, chroma_server, monkeypatch
):
    """A server that never answered /query or /get left `rag search` hanging; now each request
    gives up after SERVER_TIMEOUT and a store with caches answers from them, saying so."""
    monkeypatch.setattr(vectors, "SERVER_TIMEOUT", 1.0)
    with fault_proxy(chroma_server.url, match="/api/v2/tenants") as proxy:
        proxy.delay(30, times=None)  # every collection request held for 30 s
        stale = _store(writer.store.dir, proxy.url)
        started = time.monotonic()
        hits = stale.search("protein structure diffusion", k=1)
        first = time.monotonic() - started
        assert hits[0].paper_id == "BBBBBBBBB2"
        assert "no answer within 1 s" in (stale.store.vectors_unavailable or "")
        started = time.monotonic()
        assert stale.stats()["papers"] == 3  # the server is not asked again at once
        assert time.monotonic() - started < 1.0
        proxy.clear()
    assert first < 8.0, first  # before: the 30 s hold, on every request


# ---- items 2 and 10: the server loses its collection ---------------------------------------


def test_a_deleted_collection_stays_deleted_the_papers_stay_and_repair_pushes_them_back(
    writer, chroma_server
):
    """After delete_collection, two questions re-created it empty and then deleted the store's
    papers (`papers: 0`). Now the collection stays deleted, the caches answer, saying what
    happened, and `rag repair` writes the papers back."""
    _client(chroma_server).delete_collection(COLLECTION)
    a = _store(writer.store.dir, chroma_server.url)
    for _ in range(2):
        assert a.search("protein structure diffusion", k=1)[0].paper_id == "BBBBBBBBB2"
    assert "not on the server" in a.store.vectors_unavailable
    assert "rag repair --store" in a.store.vectors_unavailable
    assert COLLECTION not in [c.name for c in _client(chroma_server).list_collections()]
    assert a.stats()["papers"] == 3
    assert "pushed 3 papers (4 chunks)" in a.repair()
    assert _collection(chroma_server).count() == 4
    assert a.search("protein structure diffusion", k=1, mode="dense")[0].paper_id == "BBBBBBBBB2"
    fresh = _store(writer.store.dir.parent / "fresh", chroma_server.url)
    assert fresh.stats()["papers"] == 3  # the server is whole again


def test_a_collection_made_again_without_a_rebuild_keeps_every_cached_paper(
    tmp_path, writer, chroma_server
):
    """A server back on an empty volume, then another store's ingest: the new collection id made
    replicas delete their manifest. Now they keep it, add the new papers, and say how to push
    theirs back."""
    from tests.test_chroma_server import other_paper

    _client(chroma_server).delete_collection(COLLECTION)
    b = _store(tmp_path / "b", chroma_server.url)
    b.ingest([other_paper(tmp_path)], include_corpus=False)
    a = _store(writer.store.dir, chroma_server.url)
    assert a.stats()["papers"] == 4
    assert a.caught_up.replaced and a.caught_up.not_on_server == 4
    (line,) = a.caught_up.warnings(COLLECTION, "rag repair --store A")
    assert "4 of this store's chunks are not on the server" in line and "rag repair" in line
    a.repair()
    assert _collection(chroma_server).count() == 5


def test_a_rebuild_by_another_store_is_followed_and_the_old_caches_are_kept(
    tmp_path, writer, chroma_server
):
    from tests.test_chroma_server import other_paper

    b = _store(tmp_path / "b", chroma_server.url)
    b.ingest([other_paper(tmp_path)], rebuild=True, include_corpus=False, shared=True)
    a = _store(writer.store.dir, chroma_server.url)
    assert a.stats()["papers"] == 1 and a.caught_up.rebuilt
    assert (writer.store.dir / a.caught_up.aside.split("/")[-1] / "papers.sqlite").is_file()


# ---- item 9: a copied store directory ------------------------------------------------------


def test_a_copied_store_directory_cannot_write_into_the_originals_collection_unasked(
    tmp_path, small_corpus, chroma_server
):
    from tests.test_chroma_server import other_paper

    d1 = tmp_path / "d1"
    RAG(store_dir=d1, chroma_url=chroma_server.url, llm="none", embedder=HashEmbedder()).ingest(
        [small_corpus], include_corpus=False
    )
    shutil.copytree(d1, tmp_path / "d1copy")
    copy = RAG(
        store_dir=tmp_path / "d1copy", chroma_url=chroma_server.url, llm="none",
        embedder=HashEmbedder(),
    )  # fmt: skip
    name = copy.store.collection_name
    with pytest.raises(StoreError, match="is a copy of the one at .*--collection"):
        copy.ingest([other_paper(tmp_path)], include_corpus=False)
    assert _collection(chroma_server, name).count() == 4
    asked = RAG(
        store_dir=tmp_path / "d1copy", chroma_url=chroma_server.url, collection=name,
        llm="none", embedder=HashEmbedder(),
    )  # fmt: skip
    asked.ingest([other_paper(tmp_path)], include_corpus=False)
    assert _collection(chroma_server, name).count() == 5


# ---- item 8: server metadata is not trusted wholesale --------------------------------------


def test_a_write_under_another_papers_id_does_not_borrow_its_title_or_url(
    tmp_path, writer, chroma_server
):
    """An abstract written under BBBBBBBBB2 with another title was shown under that paper's title
    and URL. Its title and URL are the first abstract's; one naming another title is skipped."""
    text = "This paper was retracted for fraud; its protein results are fabricated."
    _plant(chroma_server, *_head("BBBBBBBBB2", text, title="Retraction notice"), document=text)
    _plant(chroma_server, *_head("BBBBBBBBB2", text + " Really.", title=""), document=text)
    url = "https://openreview.net/forum?id=AAAAAAAAA1"
    _plant(chroma_server, *_head("CCCCCCCCC9", "Some text.", title="C", url=url))
    for rag in (_store(tmp_path / "fresh", chroma_server.url), writer):
        hits = rag.search("retracted fraud fabricated protein", k=5)
        assert all("retracted" not in h.passage for h in hits)
        assert len(rag.caught_up.skipped) == 3
        assert "another paper's OpenReview page" in " ".join(rag.caught_up.skipped)


def test_an_abstract_over_the_ingest_limit_is_not_read_from_the_server(
    tmp_path, writer, chroma_server
):
    big = "We study long inputs. " * 240_000  # 5.3M characters: the ingest stops at 100k
    _plant(chroma_server, *_head("BIG", big, title="Big"))
    fresh = _store(tmp_path / "fresh", chroma_server.url)
    assert fresh.stats()["papers"] == 3
    assert "over the 100,000 limit" in fresh.caught_up.skipped[0]


def test_fake_replica_names_do_not_block_a_rebuild_and_a_fake_model_is_not_believed(
    tmp_path, writer, chroma_server, small_corpus
):
    col = _collection(chroma_server)
    fakes = {f"rag_replica_{i:012x}": f"evil:/nowhere/{i}" for i in range(300)}
    col.modify(metadata={**(col.metadata or {}), **fakes, "rag_embedding_model": "st:evil/x"})
    fresh = _store(tmp_path / "fresh", chroma_server.url)
    assert fresh.search("protein structure diffusion", k=1)[0].paper_id == "BBBBBBBBB2"
    assert fresh.store.meta("embedding_model") == "test-hash-embedder"
    assert "st:evil/x" in fresh.caught_up.notes[0] and "ignored" in fresh.caught_up.notes[0]
    # A is alone in the collection (fresh only read it): the 300 names do not make it shared.
    writer.ingest([small_corpus], rebuild=True, include_corpus=False)
    assert _collection(chroma_server).count() == 4


# ---- the CLI: one line each, `rag doctor` diagnoses -----------------------------------------


def test_the_cli_names_a_bad_record_in_one_line_and_doctor_lists_it(
    tmp_path, small_corpus, chroma_server
):
    """The issue's reproduction: `rag stats --store B` gave a ValueError traceback."""
    env = {"RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": COLLECTION}
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    (ingest,) = run_cli_batch(["ingest", str(small_corpus), "--no-corpus", "--store", a], env=env)
    assert ingest.returncode == 0, ingest.stderr
    _plant(chroma_server, "x:hx:0", {"paper_id": "x", "abstract_hash": "hx", "seq": "zero",
           "n_chunks": 1, "abstract": "t", "title": "T"})  # fmt: skip
    stats, search, doctor = run_cli_batch(
        ["stats", "--store", b],
        ["search", "protein diffusion", "--store", b],
        ["doctor", "--store", b],
        env=env,
    )
    assert stats.returncode == 0 and "papers: 3" in stats.stdout, stats.stderr
    lines = stats.stderr.strip().splitlines()
    assert len(lines) == 1 and "x:hx:0" in lines[0] and "Traceback" not in stats.stderr
    assert search.returncode == 0 and "Traceback" not in search.stderr
    assert "x:hx:0" in doctor.stdout and "Traceback" not in doctor.stderr
