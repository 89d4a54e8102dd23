"""Embedding providers: the bundled ONNX model, and an OpenAI-compatible embeddings endpoint
(llama.cpp's server with --embedding, on loopback)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rag import RAG
from rag.config import Settings
from rag.errors import StoreError
from rag.providers import (BULK_EMBED_MIN_PAPERS, OnnxMiniLM, TorchMiniLM, ingest_embedder, make_embedder,
                           torch_minilm_available)


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
    with pytest.raises(StoreError, match="built with embedding model 'openai:tiny-embed'"):
        RAG(store_dir=tmp_path / "store").search("protein")


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
