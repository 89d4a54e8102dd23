"""The papers' map (rag/paper_map/layout.py): layout, clusters, cache, incremental placement, `rag
map`.

Real parts: the seed store (embedded Chroma, the bundled ONNX model), openTSNE, the `rag` command.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rag import RAG, StoreError
from rag.paper_map.layout import (
    REBUILD_SHARE,
    PaperMap,
    cluster_labels,
    paper_vectors,
    trustworthiness_share,
)
from tests.conftest import icml_rows, run_cli, write_jsonl


@pytest.fixture
def seed_copy(seed_store, tmp_path):
    """A writable copy of the seed store (the map is cached in the store)."""
    store = tmp_path / "store"
    shutil.copytree(seed_store, store)
    return store


def test_seed_map_covers_every_paper_once_and_is_cached(seed_copy):
    rag = RAG(store_dir=seed_copy, llm="none")
    pmap = rag.paper_map()
    assert sorted(pmap.paper_ids) == sorted(set(pmap.paper_ids))
    assert len(pmap) == rag.stats()["papers"] == 76
    assert pmap.method == "tsne" and pmap.laid_out == 76 and pmap.appended == 0
    assert np.isfinite(pmap.xy).all() and np.abs(pmap.xy).max() == pytest.approx(1.0)
    assert len(set(map(tuple, pmap.xy.round(4).tolist()))) == 76  # no two papers on one spot
    k = len(pmap.labels)
    assert k >= 3 and sorted(set(pmap.cluster.tolist())) == list(range(k))
    assert np.all(np.diff(np.bincount(pmap.cluster)) <= 0)  # largest cluster first
    assert (
        all(label and label != "untitled" for label in pmap.labels) and len(set(pmap.labels)) == k
    )

    stamp = rag.store.map_path.stat().st_mtime_ns
    again = RAG(store_dir=seed_copy, llm="none").paper_map()
    assert rag.store.map_path.stat().st_mtime_ns == stamp  # read from the cache, not laid out again
    assert again.paper_ids == pmap.paper_ids and np.array_equal(again.xy, pmap.xy)


def test_seed_map_keeps_neighbours_better_than_principal_axes(seed_copy):
    rag = RAG(store_dir=seed_copy, llm="none")
    pmap = rag.paper_map()
    ids, vectors = paper_vectors(rag.store, rag.store.chunk_papers_after(-1))
    assert ids == pmap.paper_ids
    ours = trustworthiness_share(vectors, pmap.xy, k=5, pool=15)
    centred = vectors - vectors.mean(0)
    pca = centred @ np.linalg.svd(centred, full_matrices=False)[2][:2].T
    assert ours > trustworthiness_share(vectors, pca, k=5, pool=15)


def test_a_large_map_lays_out_a_sample_and_places_the_rest(seed_copy):
    from rag.paper_map.layout import PCA_DIMS, layout, principal_axes

    rag = RAG(store_dir=seed_copy, llm="none")
    _, vectors = paper_vectors(rag.store, rag.store.chunk_papers_after(-1))
    proj = principal_axes(vectors, PCA_DIMS)[2]
    xy, method = layout(proj, sample=40)
    assert method == "tsne on 40 + placed" and xy.shape == (76, 2) and np.isfinite(xy).all()
    assert np.abs(xy).max() == pytest.approx(1.0)
    # Which were laid out: the same seeded sample every time (a map does not reshuffle on a
    # rebuild).
    assert np.array_equal(layout(proj, sample=40)[0], xy)


def test_new_papers_are_placed_without_moving_the_others(seed_copy, small_corpus):
    rag = RAG(store_dir=seed_copy, llm="none")
    before = rag.paper_map()
    rag.ingest(small_corpus)
    after = rag.paper_map()
    assert after.paper_ids[:76] == before.paper_ids and np.array_equal(after.xy[:76], before.xy)
    assert len(after) == 79 and after.laid_out == 76 and after.appended == 3
    assert after.last_rowid == rag.store.last_rowid()
    assert np.abs(after.xy).max() <= 1.0 and set(after.cluster[76:].tolist()) <= set(
        range(len(after.labels))
    )
    # Each new paper lands nearer the mapped paper most like it than the map's typical distance.
    ids, vectors = paper_vectors(rag.store, rag.store.chunk_papers_after(-1))
    order = [ids.index(pid) for pid in after.paper_ids]
    vectors = vectors[order]
    typical = np.median(np.linalg.norm(after.xy[:76, None] - after.xy[None, :76], axis=-1))
    for i in range(76, 79):
        nearest = int(np.argmax(vectors[:76] @ vectors[i]))
        assert np.linalg.norm(after.xy[i] - after.xy[nearest]) < typical
    assert PaperMap.load(rag.store.map_path).paper_ids == after.paper_ids


def test_a_map_grown_past_its_share_is_laid_out_again(seed_copy, tmp_path):
    rag = RAG(store_dir=seed_copy, llm="none")
    rag.paper_map()
    extra = int(REBUILD_SHARE * 76) + 2
    rag.ingest(write_jsonl(tmp_path / "more.jsonl", icml_rows(extra)))
    pmap = rag.paper_map()
    assert len(pmap) == 76 + extra and pmap.laid_out == len(pmap) and pmap.appended == 0


def test_a_rebuilt_store_drops_its_map(seed_copy, small_corpus):
    rag = RAG(store_dir=seed_copy, llm="none")
    rag.paper_map()
    rag.ingest(small_corpus, rebuild=True, include_corpus=False)
    assert not rag.store.map_path.exists()
    pmap = rag.paper_map()
    assert len(pmap) == 3 and pmap.method == "pca"  # too few papers for t-SNE


def test_a_map_of_other_chunks_is_not_appended_to(seed_copy, small_corpus, tmp_path):
    """A map file of another store whose chunks end before this one's (a store replaced under its
    map.npz by hand) is laid out afresh, not taken for a map that lacks the newer papers."""
    other = RAG(store_dir=tmp_path / "other", llm="none")
    other.ingest(small_corpus)
    other.paper_map()
    rag = RAG(store_dir=seed_copy, llm="none")
    shutil.copy(other.store.map_path, rag.store.map_path)
    pmap = rag.paper_map()
    assert len(pmap) == 76 and pmap.laid_out == 76 and "AAAAAAAAA1" not in pmap.paper_ids


def test_an_unreadable_map_file_is_laid_out_again(seed_copy):
    rag = RAG(store_dir=seed_copy, llm="none")
    rag.store.map_path.write_bytes(b"not a map")
    assert len(rag.paper_map()) == 76


def test_an_empty_store_has_no_map(tmp_path, small_corpus):
    rag = RAG(store_dir=tmp_path / "s", llm="none")
    rag.ingest(small_corpus)
    rag.store.clear()
    with pytest.raises(StoreError, match="no index|empty"):
        rag.paper_map()


def test_trustworthiness_is_one_for_a_faithful_map_and_low_for_a_random_one():
    """Synthetic points (a unit test of the measure): a map that is the data itself keeps every
    neighbourhood; a random one keeps about pool/n of them."""
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 2 * np.pi, 400)
    circle = np.c_[np.cos(angles), np.sin(angles)].astype(np.float32)
    assert trustworthiness_share(circle, circle, k=5, pool=10) == pytest.approx(1.0)
    assert trustworthiness_share(circle, rng.normal(size=(400, 2)), k=5, pool=10) < 0.15


def test_cluster_labels_name_what_sets_a_cluster_apart():
    """Synthetic titles (a unit test of c-TF-IDF): generic words never lead a label."""
    titles = [
        "Learning Diffusion Models for Images",
        "Fast Diffusion Sampling",
        "Diffusion Guidance Learning",
        "Learning LLMs in Contextual Bandits",
        "Regret Bounds for Bandits",
        "Bandits with LLMs",
    ]
    labels = cluster_labels(np.array([0, 0, 0, 1, 1, 1]), 2, titles)
    assert labels[0].split(" · ")[0] == "diffusion"
    assert set(labels[1].split(" · ")[:2]) == {"bandits", "LLMs"}  # an acronym keeps its spelling
    assert "learning" not in " ".join(labels).lower()


def test_cluster_labels_name_topics_in_phrases_without_repeating_a_word():
    """A topic of several words is named whole ("time series", not "series · time"), and the parts
    of a label share no word."""
    titles = [
        "Time Series Forecasting with Transformers",
        "Long-Horizon Time Series Forecasting",
        "Anomaly Detection in Time Series",
        "Time Series Foundation Models for Forecasting",
        "Graph Neural Networks for Molecules",
        "Message Passing in Graph Neural Networks",
        "Oversmoothing of Graph Neural Networks",
    ]
    labels = cluster_labels(np.array([0, 0, 0, 0, 1, 1, 1]), 2, titles)
    assert labels[0].startswith("time series")
    assert labels[1].startswith("graph neural networks")
    for label in labels:
        words = [w for part in label.split(" · ") for w in part.split()]
        assert len(words) == len(set(words))
    # Two clusters on one topic: the smaller one is told apart by its next phrase.
    same = [
        "Sparse Attention for Time Series",
        "Time Series via Sparse Attention",
        "Sparse Attention and Time Series",
        "Sparse Attention on Graphs for Time Series",
        "Time Series on Graphs with Sparse Attention",
    ]
    twice = cluster_labels(np.array([0, 0, 0, 1, 1]), 2, same)
    assert twice[0] != twice[1] and "graphs" in twice[1]


def test_a_map_cached_with_older_labels_is_labelled_again_not_laid_out_again(seed_copy):
    rag = RAG(store_dir=seed_copy, llm="none")
    pmap = rag.paper_map()
    path = rag.store.map_path
    with np.load(path) as f:
        arrays = {name: f[name] for name in f.files}
    meta = json.loads(arrays["meta"].tobytes().decode())
    meta.pop("labels_made")
    meta["labels"] = ["old · labels"] * len(pmap.labels)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    again = RAG(store_dir=seed_copy, llm="none").paper_map()
    assert again.labels == pmap.labels and np.array_equal(again.xy, pmap.xy)
    assert PaperMap.load(path).labels == pmap.labels  # and kept


def test_rag_map_writes_a_self_contained_page(seed_copy, tmp_path):
    out = tmp_path / "map.html"
    r = run_cli(
        "map",
        "--store",
        str(seed_copy),
        "--out",
        str(out),
        "--ask",
        "How does Palimpsa relate to Mamba2?",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"wrote {out}: 76 papers in ") and "lit up: " in r.stdout
    page = out.read_text(encoding="utf-8")
    raw = page.split('<script type="application/json" id="map-data">', 1)[1].split("</script>", 1)[
        0
    ]
    data = json.loads(raw)
    assert (
        len(data["papers"]["ids"]) == 76
        and data["question"] == "How does Palimpsa relate to Mamba2?"
    )
    assert data["highlight"]["cited"] and set(data["highlight"]["cited"]) <= set(
        data["papers"]["ids"]
    )
    assert not set(data["highlight"]["cited"]) & set(data["highlight"]["retrieved"])
    assert "<script src" not in page.lower() and "<link" not in page.lower()


@pytest.mark.parametrize(
    "out, expected", [("{tmp}", "is a directory"), ("{tmp}/no/such/map.html", "does not exist")]
)
def test_rag_map_refuses_a_bad_out_path_in_one_line(seed_copy, tmp_path, out, expected):
    r = run_cli("map", "--store", str(seed_copy), "--out", out.format(tmp=tmp_path))
    assert r.returncode == 1 and expected in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_map_data_shows_latex_as_text_and_lights_up_an_answer(seed_copy):
    from rag.paper_map.layout import map_data

    rag = RAG(store_dir=seed_copy, llm="none")
    answer = rag.ask("How does Palimpsa relate to Mamba2?", llm=False)
    data = map_data(rag.store, rag.paper_map(), answer)
    papers = data["papers"]
    assert len(papers["abstracts"]) == len(papers["ids"]) == 76
    assert any("R²=1" in a for a in papers["abstracts"]) and not any(
        "$R^2" in a for a in papers["abstracts"]
    )
    assert data["highlight"]["cited"] == list(
        dict.fromkeys(s.paper_id for s in answer.cited_sources)
    )
    assert sum(c["size"] for c in data["clusters"]) == 76
    assert map_data(rag.store, rag.paper_map(), abstracts=False)["papers"]["abstracts"] is None


def test_titles_only_listing_has_every_paper_and_reads_no_abstract(seed_copy):
    store = RAG(store_dir=seed_copy, llm="none").store
    full = list(store.all_papers())
    titles_only = list(store.all_papers(abstracts=False))
    assert [p for p, _ in titles_only] == [p for p, _ in full] and len(full) == 76
    assert all(a for _, a in full) and all(a is None for _, a in titles_only)
