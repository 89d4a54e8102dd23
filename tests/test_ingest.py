"""Ingest into a real on-disk store: idempotence, dedup, bad input writes nothing, model check."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from rag import RAG
from rag.backends.embedders import MINILM_MAX_TOKENS, make_embedder
from rag.errors import CorpusError, StoreError
from tests.conftest import write_jsonl


def _rag(tmp_path, **kw) -> RAG:
    return RAG(store_dir=tmp_path / "store", llm="none", **kw)


def test_ingest_is_idempotent_and_dedups_by_id(tmp_path, small_corpus):
    rag = _rag(tmp_path)
    report = rag.ingest([small_corpus], include_corpus=False)
    # 5 records: one without abstract, one id repeated with a second abstract -> 3 papers.
    assert (report.records, report.skipped_no_abstract, report.new_papers) == (5, 1, 3)
    stats = rag.stats()
    assert stats["papers"] == 3 and stats["chunks"] == 4
    assert stats["embedding_model"] == "minilm-l6-ml-v1" and stats["schema_version"] == 1
    again = rag.ingest([small_corpus], include_corpus=False)
    assert again.wrote_nothing and again.already_indexed == 4
    assert "nothing new to index" in again.summary()
    assert rag.stats()["chunks"] == 4
    # The repeated paper is listed once, however many of its abstracts match.
    sources = rag.search("sparse mixture of experts routing load balance", k=3)
    assert [s.paper_id for s in sources].count("AAAAAAAAA1") == 1


def test_malformed_file_writes_nothing(tmp_path, small_corpus):
    rag = _rag(tmp_path)
    rag.ingest([small_corpus], include_corpus=False)
    before = rag.stats()
    good = write_jsonl(
        tmp_path / "good.jsonl", [{"id": "ZZ", "title": "New", "abstract": "A new abstract."}]
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "Y1", "abstract": "fine"}\n{oops\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2:"):
        rag.ingest([good, bad], include_corpus=False)
    assert rag.stats() == before


def test_first_ingest_into_empty_store_takes_the_corpus_and_rebuild_empties(
    tmp_path, small_corpus, seed_store
):
    import shutil

    store = tmp_path / "copy"
    shutil.copytree(seed_store, store)
    rag = RAG(store_dir=store, llm="none")
    assert rag.stats()["papers"] == 76
    assert rag.ingest([small_corpus]).new_papers == 3
    assert rag.stats()["papers"] == 79
    report = rag.ingest([small_corpus], rebuild=True, include_corpus=False)
    assert report.new_papers == 3 and rag.stats()["papers"] == 3
    assert [s.paper_id for s in rag.search("Palimpsa", k=3)] != ["wKMV7mXjUr"]


def test_chunks_fit_the_embedding_window(seed_store):
    rows = (
        sqlite3.connect(seed_store / "papers.sqlite")
        .execute("SELECT paper_id, text FROM chunks")
        .fetchall()
    )
    counts = make_embedder(RAG(store_dir=seed_store).settings).count_tokens([t for _, t in rows])
    assert max(counts) <= MINILM_MAX_TOKENS
    assert len(rows) > 76  # long abstracts were split, not truncated
    # Every word of every abstract is in some chunk of its paper.
    abstracts = (
        sqlite3.connect(seed_store / "papers.sqlite")
        .execute(
            "SELECT paper_id, group_concat(text, ' ') , abstract FROM chunks GROUP BY paper_id"
        )
        .fetchall()
    )
    for _, texts, abstract in abstracts:
        assert set(abstract.split()) <= set(texts.split())


def test_store_built_by_another_model_is_a_clear_error(tmp_path, small_corpus):
    rag = _rag(tmp_path)
    rag.ingest([small_corpus], include_corpus=False)
    other = _rag(tmp_path, embed_model="openai:text-embedding-3-small")
    with pytest.raises(
        StoreError, match="was built with embedding model 'minilm-l6-ml-v1'.*rag repair"
    ):
        other.search("routing")


def test_second_writer_is_refused(tmp_path, small_corpus):
    rag = _rag(tmp_path)
    with rag.store.writer():
        with pytest.raises(StoreError, match="another ingest is writing"):
            _rag(tmp_path).ingest([small_corpus], include_corpus=False)


def test_keyword_index_is_persisted_and_loaded(tmp_path, small_corpus):
    rag = _rag(tmp_path)
    rag.ingest([small_corpus], include_corpus=False)
    path = tmp_path / "store/keyword.json"
    assert path.exists()
    mtime = path.stat().st_mtime_ns
    fresh = _rag(tmp_path)
    assert fresh.search("protein diffusion", k=1, mode="bm25")[0].paper_id == "BBBBBBBBB2"
    assert path.stat().st_mtime_ns == mtime  # loaded, not rebuilt


def test_keyword_index_of_an_older_format_is_rebuilt_by_the_next_ingest(tmp_path, small_corpus):
    """A store indexed before a tokenizer change: queries rebuild the index in memory, `rag ingest`
    (with nothing new) rewrites it, and the doctor says so in between. The single-file index of
    earlier versions (keyword.npz) is replaced the same way."""
    import json

    from rag.doctor import run_checks
    from rag.index.keyword import FORMAT, KeywordIndex

    rag = _rag(tmp_path)
    rag.ingest([small_corpus], include_corpus=False)
    path = tmp_path / "store/keyword.json"
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "format": FORMAT - 1}))
    (tmp_path / "store/keyword.npz").write_bytes(b"an index of an earlier version")
    with pytest.raises(ValueError, match="another version"):
        KeywordIndex.load(path)
    fresh = _rag(tmp_path)
    assert fresh.store.keyword_index_stale()
    assert fresh.search("protein diffusion", k=1, mode="bm25")[0].paper_id == "BBBBBBBBB2"
    check = next(c for c in run_checks(fresh) if c.name == "keyword index")
    assert check.status == "warn" and "older format" in check.detail and check.fix == "rag ingest"
    assert fresh.ingest([small_corpus], include_corpus=False).wrote_nothing
    assert not fresh.store.keyword_index_stale()
    assert json.loads(path.read_text())["format"] == FORMAT
    assert not (tmp_path / "store/keyword.npz").exists()


def test_the_keyword_stemmer_is_recorded_with_the_store_and_switched_by_an_ingest(
    tmp_path, small_corpus
):
    """A store keeps the stemmer it was created with (queries fold words as its index does, whatever
    the setting says later); `rag ingest` with another one set rebuilds the keyword index that way,
    with nothing to embed."""
    assert _rag(tmp_path / "a").ingest([small_corpus], include_corpus=False).new_papers
    assert _rag(tmp_path / "a").store.keyword_stemmer() == "light"  # auto, with MiniLM

    rag = _rag(tmp_path, keyword_stemmer="snowball")
    rag.ingest([small_corpus], include_corpus=False)
    manifest = tmp_path / "store/keyword.json"
    assert json.loads(manifest.read_text())["stemmer"] == "snowball"
    # "balancing" is only ever written "balances" / "balanced": one stem in Snowball's terms.
    assert [h.paper_id for h in _rag(tmp_path).search("balancing", k=1, mode="bm25")] == [
        "AAAAAAAAA1"
    ]

    light = _rag(tmp_path, keyword_stemmer="light")
    assert light.ingest([small_corpus], include_corpus=False).wrote_nothing
    assert light.store.keyword_stemmer() == "light"
    assert json.loads(manifest.read_text())["stemmer"] == "light"
    assert _rag(tmp_path).search("balancing", k=1, mode="bm25") == []
    assert [h.paper_id for h in _rag(tmp_path).search("balances", k=1, mode="bm25")] == [
        "AAAAAAAAA1"
    ]


def test_orphan_vectors_of_a_killed_ingest_are_ignored(tmp_path, small_corpus):
    """Vectors written without their manifest rows (as after a kill) never show up in results."""
    rag = _rag(tmp_path)
    rag.ingest([small_corpus], include_corpus=False)
    vector = rag.embedder.embed(["protein structure diffusion"])[0]
    rag.store.collection().upsert(
        ids=["ORPHAN:0:0"], embeddings=[vector], metadatas=[{"paper_id": "ORPHAN"}]
    )
    ids = [s.paper_id for s in rag.search("protein structure diffusion", k=5, mode="dense")]
    assert "ORPHAN" not in ids and ids[0] == "BBBBBBBBB2"


ARENAS_PROBE = """
import ctypes, sys, threading
from rag.index.ingest import bound_malloc_arenas

capped = bound_malloc_arenas() if sys.argv[1] == "cap" else None
ready, done, blocks = threading.Barrier(7), threading.Event(), []

def work():  # each thread mallocs (100 kB: from an arena, under the mmap threshold) and stays alive
    blocks.append([bytearray(100_000) for _ in range(4)])
    ready.wait()
    done.wait()

threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
ready.wait()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
fp = ctypes.c_void_p(libc.fopen(sys.argv[2].encode(), b"w"))
libc.malloc_info(0, fp)
libc.fclose(fp)
done.set()
for t in threads:
    t.join()
print(capped, open(sys.argv[2]).read().count("<heap nr="))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_ingest_caps_malloc_arenas_so_threads_share_them(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}

    def arenas(mode: str) -> tuple[str, int]:
        out = subprocess.run(
            [sys.executable, "-c", ARENAS_PROBE, mode, str(tmp_path / f"{mode}.xml")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        return out[0], int(out[1])

    assert arenas("plain")[1] >= 4  # six live threads: glibc's default gives most their own arena
    assert arenas("cap") == ("True", 2)
    # A user's own MALLOC_ARENA_MAX is left alone.
    env["MALLOC_ARENA_MAX"] = "3"
    assert arenas("cap")[0] == "False"


def test_a_store_made_inside_a_checkout_is_left_out_of_git(tmp_path, small_corpus):
    """`rag ingest ... --store my-papers` run in a clone: the store ignores itself, as a venv does,
    so `git status` lists nothing new (issue 51)."""
    repo = tmp_path / "clone"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    RAG(store_dir=repo / "my-papers", llm="none").ingest([small_corpus], include_corpus=False)
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == ""
