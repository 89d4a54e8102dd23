"""The BM25 keyword index (rag/index/keyword.py): scores against a plain reference implementation,
appends equal to a full rebuild, segments on disk, and an ingest that appends instead of rebuilding.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from itertools import islice

import pytest

from rag import RAG
from rag.index import keyword
from rag.index.keyword import KeywordIndex
from rag.testing import HashEmbedder
from rag.text import keyword_terms, keyword_terms_with
from tests.conftest import ICML_SAMPLE, write_jsonl

DATA = ICML_SAMPLE
QUERIES = [
    "diffusion models for protein design",
    "sparse mixture of experts routing",
    "in-context learning of transformers",
    "LLM reasoning with reinforcement learning rewards",
    "graph neural networks",
    "Mamba2 state space model",
    "a question with no indexed word: zyxwv",
]


@pytest.fixture(scope="module")
def rows() -> list[tuple[int, str]]:
    """600 real abstracts as (key, text) rows, keys increasing with gaps (as rowids may have)."""
    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        texts = [json.loads(line)["abstract"] for line in islice(fh, 600)]
    return [(3 * i + 1, t) for i, t in enumerate(texts) if t]


def reference_bm25(
    rows, query: str, k1: float = 1.2, b: float = 0.75, terms=keyword_terms
) -> dict[int, float]:
    """BM25 written out plainly, in floats, from the tokens: what the index must compute."""
    docs = {key: Counter(terms(text)) for key, text in rows}
    lengths = {key: sum(c.values()) for key, c in docs.items()}
    avg = sum(lengths.values()) / len(docs)
    scores: dict[int, float] = {}
    for term in set(terms(query)):
        df = sum(1 for c in docs.values() if term in c)
        if not df:
            continue
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for key, c in docs.items():
            if term in c:
                tf = c[term]
                scores[key] = scores.get(key, 0.0) + idf * tf * (k1 + 1) / (
                    tf + k1 * (1 - b + b * lengths[key] / avg)
                )
    return scores


@pytest.mark.parametrize("segment_docs", [32_768, 50])
def test_search_scores_are_bm25(rows, monkeypatch, segment_docs):
    """In one segment or many, the top documents and their scores are BM25's (float32 aside)."""
    monkeypatch.setattr(keyword, "SEGMENT_DOCS", segment_docs)
    index = KeywordIndex.build(rows)
    assert len(index.segments) == math.ceil(len(rows) / segment_docs)
    for query in QUERIES:
        expected = reference_bm25(rows, query)
        got = index.search(query, 10)
        best = sorted(expected.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        assert len(got) == len(best)
        for (key, score), (ref_key, ref_score) in zip(got, best):
            assert score == pytest.approx(ref_score, rel=1e-5)
            # a tie may swap keys
            assert key == ref_key or score == pytest.approx(expected[key], rel=1e-5)
    assert index.search("zyxwv", 5) == []


def test_a_snowball_index_scores_bm25_of_stems_and_remembers_its_stemmer(rows, tmp_path):
    """The Snowball index matches other forms of a word ("optimizing" ~ "optimization"), which the
    light fold does not, scores them as BM25 of the stems, and is loaded back with the same stemmer.
    """
    snowball = KeywordIndex.build(rows, stemmer="snowball")
    light = KeywordIndex.build(rows)
    stems = keyword_terms_with("snowball")
    query = "optimizing routers"
    expected = reference_bm25(rows, query, terms=stems)
    got = snowball.search(query, 10)
    assert got and [s for _, s in got] == pytest.approx(
        sorted(expected.values(), reverse=True)[:10], rel=1e-5
    )
    found = {key for key, _ in got}
    assert any("optimization" in dict(rows)[key].lower() for key in found)
    assert not {key for key, _ in light.search(query, 10)} >= found  # light misses some of them
    snowball.save(tmp_path / "keyword.json")
    loaded = KeywordIndex.load(tmp_path / "keyword.json")
    assert loaded.stemmer == "snowball" and loaded.search(query, 10) == got
    body = json.loads((tmp_path / "keyword.json").read_text())
    del body["stemmer"]  # as written before stemmers were recorded
    (tmp_path / "keyword.json").write_text(json.dumps(body))
    assert KeywordIndex.load(tmp_path / "keyword.json").stemmer == "light"


@pytest.mark.parametrize("segment_docs", [32_768, 50])
def test_scores_of_gives_any_documents_bm25(rows, monkeypatch, segment_docs):
    """`scores_of` scores documents that another list ranked (beyond the top n, or holding no query
    word: 0.0), as BM25 does; a key not indexed scores 0.0."""
    monkeypatch.setattr(keyword, "SEGMENT_DOCS", segment_docs)
    index = KeywordIndex.build(rows)
    keys = [key for key, _ in rows[::7]] + [2]  # every 7th document, and a key no row has
    for query in QUERIES:
        expected = reference_bm25(rows, query)
        got = index.scores_of(query, keys)
        assert set(got) == set(keys)
        for key in keys:
            assert got[key] == pytest.approx(expected.get(key, 0.0), rel=1e-5, abs=1e-6)
        assert dict(index.search(query, 5)) == {
            key: index.scores_of(query, [key])[key] for key, _ in index.search(query, 5)
        }


def test_appends_score_exactly_as_a_full_rebuild(rows, monkeypatch, tmp_path):
    """Documents appended in uneven steps (merging small tail segments on the way) give the very
    scores a build of all of them at once gives, and so does the saved index, reloaded."""
    monkeypatch.setattr(keyword, "SEGMENT_DOCS", 128)
    full = KeywordIndex.build(rows)
    index = KeywordIndex.build(rows[:130], tmp_path / "keyword")
    for lo, hi in [(130, 131), (131, 200), (200, 450), (450, len(rows))]:
        index = index.appended(rows[lo:hi], tmp_path / "keyword")
    assert len(index.segments) > 1 and len(index) == len(full)
    index.save(tmp_path / "keyword.json")
    loaded = KeywordIndex.load(tmp_path / "keyword.json")
    assert loaded.keys.tolist() == full.keys.tolist() == [k for k, _ in rows]
    for query in QUERIES:
        assert index.search(query, 20) == full.search(query, 20) == loaded.search(query, 20)
        assert loaded.rare_term_keys(query, lambda keys: keys, 5) == full.rare_term_keys(
            query, lambda keys: keys, 5
        )
    # Only the segments the manifest names are left on disk.
    assert sorted(p.name for p in (tmp_path / "keyword").iterdir()) == sorted(
        s.name for s in loaded.segments
    )


def test_appended_keys_must_follow(rows):
    index = KeywordIndex.build(rows[:10])
    with pytest.raises(ValueError, match="follow"):
        index.appended([(rows[0][0], "an older key")])


def _store_rows(rag: RAG) -> list[tuple[int, str]]:
    return list(rag.store._db().execute("SELECT rowid, text FROM chunks ORDER BY rowid"))


def test_an_ingest_appends_to_the_keyword_index_and_equals_a_rebuild(tmp_path, monkeypatch):
    """A second ingest writes new segments for its chunks only: the first ingest's segments stay
    on disk untouched, and the index equals one built from all the store's chunks."""
    monkeypatch.setattr(keyword, "SEGMENT_DOCS", 16)
    with gzip.open(DATA, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for line in islice(fh, 60)]
    # The keyword index is the point, not the vectors: a model-free embedder keeps this in the fast
    # tier.
    rag = RAG(store_dir=tmp_path / "store", llm="none", embedder=HashEmbedder())
    rag.ingest([write_jsonl(tmp_path / "a.jsonl", records[:40])], include_corpus=False)
    manifest = tmp_path / "store/keyword.json"
    first = json.loads(manifest.read_text())["segments"]
    assert len(first) >= 3
    stamps = {
        s["name"]: (tmp_path / "store/keyword" / s["name"] / "docs.npy").stat().st_mtime_ns
        for s in first[:-1]
    }
    rag.ingest([write_jsonl(tmp_path / "b.jsonl", records[40:])], include_corpus=False)
    second = json.loads(manifest.read_text())["segments"]
    for name, mtime in stamps.items():  # every full segment of the first ingest is kept as it was
        assert any(s["name"] == name for s in second)
        assert (tmp_path / "store/keyword" / name / "docs.npy").stat().st_mtime_ns == mtime
    fresh = RAG(store_dir=tmp_path / "store", llm="none")
    assert not fresh.store.keyword_index_stale()
    rebuilt = KeywordIndex.build(_store_rows(fresh))
    persisted = fresh.store.keyword_index()
    assert persisted.keys.tolist() == rebuilt.keys.tolist()
    for query in QUERIES:
        assert persisted.search(query, 20) == rebuilt.search(query, 20)


def test_a_reader_sees_chunks_the_persisted_index_lacks(tmp_path, small_corpus):
    """Chunks committed after the keyword index was saved (an ingest running or killed) are found:
    the reader appends them in memory, leaving the file to the next ingest."""
    rag = RAG(store_dir=tmp_path / "store", llm="none")
    rag.ingest([small_corpus], include_corpus=False)
    manifest = tmp_path / "store/keyword.json"
    saved = manifest.read_bytes()
    other = write_jsonl(
        tmp_path / "more.jsonl",
        [
            {
                "id": "ZEBRA1",
                "title": "Zebra stripes",
                "abstract": "Zebrafish stripe patterns from reaction diffusion.",
            }
        ],
    )
    rag.ingest([other], include_corpus=False)
    manifest.write_bytes(saved)  # as if killed after its last commit, before the keyword save
    reader = RAG(store_dir=tmp_path / "store", llm="none")
    assert reader.store.keyword_index_stale()
    assert reader.search("zebrafish stripe", k=1, mode="bm25")[0].paper_id == "ZEBRA1"
    assert manifest.read_bytes() == saved
    # repairs the index: appends the lag
    assert rag.ingest([other], include_corpus=False).wrote_nothing
    assert not reader.store.keyword_index_stale()
    assert json.loads(manifest.read_text())["docs"] == reader.store.chunk_count()


def test_snowball_stems_alike_from_many_threads():
    """The server answers on several threads, and the keyword index and the topic check stem on
    each: a stemmer shared between them mixed their words up (IndexError inside it, or another
    word's stem)."""
    import random
    import threading

    import snowballstemmer

    from rag.text import _snowball

    rng = random.Random(3)
    words = [
        "".join(rng.choice("abcdefghilmnoprstuvyz") for _ in range(rng.randint(4, 14))) + suffix
        for suffix in ("ing", "ation", "ly", "ness", "ed", "s", "ful", "ically")
        for _ in range(2500)
    ]
    expected = [snowballstemmer.stemmer("english").stemWord(w) for w in words]
    stem = _snowball()
    errors: list[BaseException] = []
    results: dict[int, list[str]] = {}

    def run(k: int) -> None:
        try:
            part = words[k::6]
            results[k] = [stem(w) for w in part]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(results[k] == expected[k::6] for k in range(6))
