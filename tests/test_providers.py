"""Embedding providers: the bundled ONNX model, and an OpenAI-compatible embeddings endpoint
(llama.cpp's server with --embedding, on loopback)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rag import RAG
from rag.config import Settings
from rag.errors import StoreError
from rag.providers import OnnxMiniLM, make_embedder


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
