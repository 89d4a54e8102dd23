"""Embedders (rag/backends/embedders/): the bundled ONNX model, the torch encoders written out in
rag/backends/embedders/torch_encoders.py, an OpenAI-compatible embeddings endpoint (llama.cpp's
server with --embedding, on loopback), the registry of model names and the choice of runtime for an
ingest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rag import RAG
from rag.backends.embedders import (
    BULK_EMBED_MIN_PAPERS,
    Embedder,
    ingest_embedder,
    known_model,
    make_embedder,
    sentence_scorer,
)
from rag.backends.embedders.onnx import ML_MINILM_DIR, OnnxMiniLM, OnnxMiniLMBulk, ml_minilm_files
from rag.backends.embedders.torch_encoders import TorchMiniLM, TorchMpnet, torch_minilm_available
from rag.backends.modelfiles import mpnet_available
from rag.config import Settings
from rag.errors import StoreError

CORPUS = Path(__file__).resolve().parent.parent / "corpus"
# Two of the four files of the bundled corpus, 19 seed papers each (their ids from
# seed_metadata.jsonl): a quarter of the seeds' ingest, for the tests below of how an index is
# built, recorded and queried with a model. A model's quality is asserted elsewhere: its vectors
# against a reference (here), rankings by rag eval. holds wKMV7mXjUr, "Learning to Remember, ..."
# (Palimpsa)
PALIMPSA_FILE = CORPUS / "000_edb77d9566bdbf19.txt"
STACKELBERG_FILE = CORPUS / "004_ecaf3ed1590457d4.txt"  # holds TgohCXoblV, "... A Stackelberg ..."


def test_onnx_minilm_gives_unit_vectors_that_rank_paraphrases_close():
    model = OnnxMiniLM()
    a, b, c = np.array(
        model.embed(
            [
                "A cat sits on the mat.",
                "A kitten is sitting on a rug.",
                "Stock markets fell sharply today.",
            ]
        )
    )
    assert np.allclose([np.linalg.norm(a), np.linalg.norm(b)], 1.0, atol=1e-4)
    assert a @ b > a @ c + 0.2
    # Batching and padding do not change a text's vector.
    alone = np.array(model.embed(["A cat sits on the mat."]))[0]
    bulk = np.array(
        OnnxMiniLMBulk().embed(
            [
                "A cat sits on the mat.",
                "A kitten is sitting on a rug.",
                # batches run two at a time
                "Stock markets fell sharply today.",
            ]
            * 3
        )
    )
    assert np.allclose(bulk, [a, b, c] * 3, atol=1e-5)
    assert float(alone @ a) > 0.9999


def test_texts_over_the_window_are_refused_not_truncated():
    with pytest.raises(ValueError, match="more than 256 word pieces"):
        OnnxMiniLM().embed(["word " * 400])
    assert len(OnnxMiniLM().embed_query("word " * 400)) == 384  # questions are cut, never the index


@pytest.mark.parametrize("model", ["all-MiniLM-L6-v2", "minilm-l6-ml-v1"])
def test_word_pieces_counted_for_chunking_embed_as_fresh_text(model):
    """An ingest counts each chunk's word pieces, and the embedder keeps them for embedding: a
    counted text embeds to its uncounted vector, and a text counted once and embedded twice, or
    cut to the window, still does."""
    texts = ["A cat sits on the mat.", "word " * 300, "Stock markets fell sharply today."] * 2
    fresh = np.array(OnnxMiniLM(model).embed(texts, truncate=True))
    counting = OnnxMiniLM(model)
    assert counting.count_tokens(texts[:3]) == [9, 302, 8]
    assert np.allclose(counting.embed(texts, truncate=True), fresh, atol=1e-6)
    assert np.allclose(counting.embed(texts, truncate=True), fresh, atol=1e-6)
    counting.count_tokens(texts[1:2])
    with pytest.raises(ValueError, match="more than 256 word pieces"):
        counting.embed(texts[1:2])


def test_default_query_path_never_imports_torch(seed_store):
    import subprocess

    code = (
        "import sys; from rag import RAG; r = RAG(store_dir=sys.argv[1]); r.ask('Palimpsa and"
        " Mamba2'); print('torch' in sys.modules, 'sentence_transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(seed_store)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False False"


def test_unknown_embedding_model_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="unknown embedding model 'bert'; set RAG_EMBED_MODEL"):
        make_embedder(Settings(store_dir=tmp_path, embed_model="bert"))


def test_one_registry_of_model_names(tmp_path):
    """The names make_embedder accepts are the ones known_model (and the settings through it)
    accept, and the error for any other lists them all."""

    for name in (
        "all-MiniLM-L6-v2",
        "minilm-l6-ml-v1",
        "all-mpnet-base-v2",
        "nomic-embed-text-v1.5",
        "openai:text-embedding-3-small",
        "st:some/model",
    ):
        assert known_model(name), name
    for name in ("bert", "", "all-minilm-l6-v2", "openai", "st", "sentence-transformers:x"):
        assert not known_model(name), name
    with pytest.raises(StoreError) as err:
        make_embedder(Settings(store_dir=tmp_path, embed_model="bert"))
    assert str(err.value).endswith(
        "set RAG_EMBED_MODEL to 'minilm-l6-ml-v1', 'all-MiniLM-L6-v2', 'all-mpnet-base-v2', "
        "'nomic-embed-text-v1.5', 'openai:<model>' or 'st:<model>'"
    )
    # One shared instance per configuration.
    settings = Settings(store_dir=tmp_path)
    assert make_embedder(settings) is make_embedder(settings)
    assert isinstance(make_embedder(settings), OnnxMiniLM)


def test_every_embedder_has_the_embedder_surface(tmp_path):
    """Each family provides what callers use (the `Embedder` protocol); building none of them loads
    a model."""
    from rag.backends.embedders.openai_compat import OpenAIEmbedder
    from rag.backends.embedders.sentence_transformers import SentenceTransformersEmbedder

    assert isinstance(OnnxMiniLM(), Embedder)
    assert isinstance(TorchMiniLM(bf16=False), Embedder)
    assert isinstance(TorchMpnet(Settings(store_dir=tmp_path, model_cache_dir=tmp_path)), Embedder)
    openai_embedder = OpenAIEmbedder(
        Settings(store_dir=tmp_path, embed_model="openai:m", embed_base_url="http://127.0.0.1:9/v1")
    )
    assert isinstance(openai_embedder, Embedder) and openai_embedder.max_tokens is None
    assert openai_embedder.model_id == "openai:m"
    # Making one loads a sentence-transformers model (torch); its attributes are checked by mypy.
    for name in ("count_tokens", "embed", "embed_query"):
        assert callable(getattr(SentenceTransformersEmbedder, name)), name


def test_importing_the_embedders_loads_no_runtime():
    """`import rag.backends.embedders` (the registry) imports no model runtime: the CLI starts
    fast."""
    import subprocess

    code = (
        "import sys, rag.backends.embedders; print(sorted(m for m in ('onnxruntime', 'tokenizers',"
        " 'torch', 'openai', 'sentence_transformers', 'rag.backends.embedders.onnx',"
        " 'rag.backends.embedders.torch_encoders') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_openai_compatible_embeddings_endpoint(tmp_path, small_corpus, llama_server_factory):
    server = llama_server_factory(extra_args=["--embedding", "True"], model_alias="tiny-embed")
    rag = RAG(
        store_dir=tmp_path / "store",
        embed_model=f"openai:{server.model}",
        embed_base_url=server.base_url,
        llm="none",
    )
    report = rag.ingest([small_corpus], include_corpus=False)
    assert report.new_papers == 3
    stats = rag.stats()
    assert stats["embedding_model"] == "openai:tiny-embed" and stats["chunks"] == 4
    sources = rag.search("protein structure diffusion", k=3, mode="dense")
    assert len(sources) == 3 and len({s.paper_id for s in sources}) == 3
    # Without RAG_EMBED_MODEL the index is queried with the model that built it; another model is
    # refused.
    later = RAG(store_dir=tmp_path / "store", embed_base_url=server.base_url, llm="none")
    assert later.settings.embed_model == "openai:tiny-embed"
    assert [s.paper_id for s in later.search("protein structure diffusion", k=3, mode="dense")] == [
        s.paper_id for s in sources
    ]
    with pytest.raises(StoreError, match="built with embedding model 'openai:tiny-embed'"):
        RAG(store_dir=tmp_path / "store", embed_model="all-MiniLM-L6-v2").search("protein")


needs_fast = pytest.mark.skipif(
    not torch_minilm_available(), reason="needs the [fast] extra (torch)"
)


@needs_fast
def test_torch_minilm_gives_the_onnx_models_vectors():
    """The bf16 torch encoder (written out in torch_encoders.py) is the same model: vectors match
    the int8 ONNX ones to cosine >= 0.998 and the fp32 torch ones to >= 0.9998, padding changes
    nothing."""
    texts = [
        "A cat sits on the mat.",
        "Stock markets fell sharply today.",
        "We propose a state space model that learns to forget, with " + "long context " * 60,
    ]
    onnx = np.array(OnnxMiniLM().embed(texts))
    bf16 = np.array(TorchMiniLM(bf16=True).embed(texts))
    fp32 = np.array(TorchMiniLM(bf16=False).embed(texts))
    assert np.allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-4)
    assert (onnx * bf16).sum(axis=1).min() > 0.998
    assert (fp32 * bf16).sum(axis=1).min() > 0.9998
    # batched with the long text = padded
    alone = np.array(TorchMiniLM(bf16=True).embed(texts[:1]))[0]
    assert float(alone @ bf16[0]) > 0.9995
    with pytest.raises(ValueError, match="more than 256 word pieces"):
        TorchMiniLM().embed(["word " * 400])


def test_ingest_embedder_choice(tmp_path, monkeypatch):
    """Which runtime indexes an ingest. Logic only: availability and CPU flags are patched here,
    since no real machine can show both answers; the real runtimes are tested above and below."""
    from rag.backends.embedders import torch_encoders

    onnx = OnnxMiniLM()
    monkeypatch.setattr(torch_encoders, "torch_minilm_available", lambda: True)
    monkeypatch.setattr(torch_encoders, "cpu_has_bf16", lambda: True)
    auto = Settings(store_dir=tmp_path)
    # small: loading torch would cost more than it saves
    assert ingest_embedder(auto, onnx, 76) is onnx
    assert isinstance(ingest_embedder(auto, onnx, BULK_EMBED_MIN_PAPERS), TorchMiniLM)
    assert isinstance(
        ingest_embedder(Settings(store_dir=tmp_path, embed_backend="onnx"), onnx, 10**5),
        OnnxMiniLMBulk,
    )
    assert ingest_embedder(Settings(store_dir=tmp_path, embed_backend="onnx"), onnx, 10) is onnx
    assert isinstance(
        ingest_embedder(Settings(store_dir=tmp_path, embed_backend="torch"), onnx, 1), TorchMiniLM
    )
    # fp32 torch is slower than int8 ONNX
    monkeypatch.setattr(torch_encoders, "cpu_has_bf16", lambda: False)
    assert isinstance(ingest_embedder(auto, onnx, 10**5), OnnxMiniLMBulk)
    monkeypatch.setattr(torch_encoders, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(torch_encoders, "torch_minilm_available", lambda: False)
    assert isinstance(ingest_embedder(auto, onnx, 10**5), OnnxMiniLMBulk)
    # minilm-l6-ml-v1 has no torch runtime: ONNX in bulk for big ingests, whatever the backend
    ml = OnnxMiniLM("minilm-l6-ml-v1")
    assert ingest_embedder(auto, ml, 10) is ml
    for backend in ("auto", "torch", "onnx"):
        bulk = ingest_embedder(Settings(store_dir=tmp_path, embed_backend=backend), ml, 10**5)
        assert isinstance(bulk, OnnxMiniLMBulk) and bulk.model_id == "minilm-l6-ml-v1"
    # an export run under its own name keeps its files in bulk
    files = ml_minilm_files()
    export = OnnxMiniLM("my-export", files)
    bulk = ingest_embedder(auto, export, 10**5)
    assert bulk.model_id == "my-export" and bulk.files == files
    assert np.allclose(bulk.embed(["a test"]), export.embed(["a test"]), atol=1e-5)
    other = object()  # openai:/st: embedders are used as configured
    assert (
        ingest_embedder(Settings(store_dir=tmp_path, embed_backend="torch"), other, 10**5) is other
    )
    with pytest.raises(StoreError, match=r"pip install -e '.\[fast\]'"):
        TorchMiniLM()._load()


@pytest.mark.slow
@needs_fast
def test_store_indexed_by_torch_answers_like_onnx(tmp_path):
    """The same papers indexed by each runtime: one index format, the same papers found. 19 seed
    papers (STACKELBERG_FILE), not all 76: 7 s instead of 54 on a busy 2-core machine."""
    questions = [
        "How do in-context learning and activation steering relate?",
        "Stackelberg view of learning rates",
        "distributional reinforcement learning for LLMs with quantiles",
        "which papers detect whether text was in the pretraining data?",
    ]
    found = {}
    for backend in ("onnx", "torch"):
        rag = RAG(store_dir=tmp_path / backend, embed_backend=backend, llm="none")
        assert rag.ingest([STACKELBERG_FILE], include_corpus=False).new_papers == 19
        found[backend] = [[s.paper_id for s in rag.search(q, k=5, mode="dense")] for q in questions]
    for a, b in zip(found["onnx"], found["torch"]):
        assert a[0] == b[0] and len(set(a) & set(b)) >= 4


def test_ml_minilm_is_bundled_checked_and_answers_score_with_the_default(tmp_path):
    """minilm-l6-ml-v1 (all-MiniLM-L6-v2 trained on questions about ML papers) ships in the
    package with its checksum; a damaged copy is refused with the fix; answers score sentences
    with all-MiniLM-L6-v2, whose cosines the answer rules and the injection probe were measured
    with."""
    import shutil

    ml, default = OnnxMiniLM("minilm-l6-ml-v1"), OnnxMiniLM()
    texts = ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stocks fell sharply."]
    a, b, c = np.array(ml.embed(texts))
    assert np.allclose([np.linalg.norm(v) for v in (a, b, c)], 1.0, atol=1e-4)
    assert a @ b > a @ c + 0.2 and len(a) == 384
    abstract = PALIMPSA_FILE.read_text().split("\n\n")[1][:600]
    assert float(np.dot(ml.embed([abstract])[0], default.embed([abstract])[0])) < 0.98
    damaged = tmp_path / "minilm_ml"
    shutil.copytree(ML_MINILM_DIR, damaged)
    model = damaged / "model.onnx"
    model.write_bytes(model.read_bytes()[:-1] + b"x")
    with pytest.raises(StoreError, match=r"does not match its checksum.*pip install -e \."):
        ml_minilm_files(damaged)
    assert sentence_scorer(default) is default
    assert sentence_scorer(ml).model_id == "all-MiniLM-L6-v2"


def test_ml_minilm_gives_the_same_vectors_on_every_cpu():
    """minilm-l6-ml-v1's vectors against ones made with exact int8 products
    (tests/data/minilm_ml_reference.json): a CPU whose int8 products saturate (AVX2 without VNNI)
    gets the weights as uint8, whose products every CPU computes exactly. Saturated, the long text
    came out at cosine ~0.98; here >= 0.9999, on any CPU."""
    ref = json.loads((Path(__file__).parent / "data/minilm_ml_reference.json").read_text())
    got = np.asarray(OnnxMiniLM("minilm-l6-ml-v1").embed(ref["texts"], truncate=True))
    assert (got * np.asarray(ref["vectors"])).sum(axis=1).min() >= 0.9999


def test_weights_rewritten_as_uint8_are_the_same_integers():
    """`unsigned_weights` rewrites only what `MatMulInteger` multiplies by (36 weight matrices and
    their zero points), once: a second pass finds no int8 weight, a model without int8 products
    (all-MiniLM-L6-v2's) none; ONNX Runtime runs the rewrite to the reference vectors."""
    import onnxruntime as ort

    from rag.backends.embedders.int8_products import unsigned_weights
    from rag.backends.embedders.onnx import minilm_files

    data = bytearray(ml_minilm_files()[0].read_bytes())
    assert unsigned_weights(data) == 72
    assert unsigned_weights(data) == 0
    assert unsigned_weights(bytearray(minilm_files()[0].read_bytes())) == 0
    embedder = OnnxMiniLM("minilm-l6-ml-v1")
    embedder._load()
    embedder._session = ort.InferenceSession(bytes(data), providers=["CPUExecutionProvider"])
    ref = json.loads((Path(__file__).parent / "data/minilm_ml_reference.json").read_text())
    got = np.asarray(embedder.embed(ref["texts"], truncate=True))
    assert (got * np.asarray(ref["vectors"])).sum(axis=1).min() >= 0.9999


@pytest.mark.slow
def test_store_built_with_the_ml_model_is_queried_with_it(tmp_path, seed_titles):
    """An index of minilm-l6-ml-v1 is searched with it by later commands without RAG_EMBED_MODEL,
    while its answers score sentences with all-MiniLM-L6-v2 (the injection probe's model)."""
    from rag.answer.injection import probe_embed

    store = tmp_path / "store"
    built = RAG(store_dir=store, embed_model="minilm-l6-ml-v1", llm="none")
    assert built.ingest([STACKELBERG_FILE], include_corpus=False).new_papers == 19
    later = RAG(store_dir=store, llm="none")
    assert later.stats()["embedding_model"] == "minilm-l6-ml-v1"
    assert later._query_embedder.model_id == "minilm-l6-ml-v1"
    assert later._answer_embedder.model_id == "all-MiniLM-L6-v2"
    assert probe_embed(later._answer_embedder) is not None
    question = "Which paper treats the layers of a network and their learning rates as a game?"
    hits = later.search(question, k=3, mode="dense")
    assert "Stackelberg" in seed_titles[hits[0].paper_id]
    # A search shows the index's own cosines (fast: one question embedded); an answer reads its
    # hits with all-MiniLM-L6-v2: the passage shown, and the paper's best chunk.
    default = OnnxMiniLM()
    q = np.asarray(default.embed_query(question))
    hits = later._retrieve(question, 3, "hybrid", scored=False)
    answer = later.ask(question, k=3, mode="hybrid")
    sources = {s.paper_id: s for s in answer.sources}
    assert set(sources) == {h.paper.paper_id for h in hits}
    for hit in hits:
        source = sources[hit.paper.paper_id]
        texts = later.store.chunk_texts([hit.paper.paper_id])[hit.paper.paper_id]
        cosines = np.asarray(default.embed(texts, truncate=True)) @ q
        shown = float(q @ default.embed([hit.chunk.text])[0])
        assert source.retrieval.cosine == pytest.approx(shown, abs=1e-3)
        assert hit.cosine != pytest.approx(shown, abs=1e-3)  # the search's: the index model's
        assert source.score == pytest.approx(min(1.0, max(0.0, shown)), abs=1e-3)
        assert cosines.max() >= shown - 1e-3
    assert answer.outcome != "not_covered"
    with pytest.raises(StoreError, match="set RAG_EMBED_MODEL=minilm-l6-ml-v1"):
        RAG(store_dir=store, embed_model="all-MiniLM-L6-v2").search("learning rates")


needs_mpnet = pytest.mark.skipif(not mpnet_available(), reason="needs the [mpnet] extra")


@needs_mpnet
def test_mpnet_gives_sentence_transformers_vectors(mpnet_cache):
    """rag's written-out MPNet encoder against sentence-transformers' vectors for the same texts
    (tests/data/mpnet_reference.json, made by make_mpnet_reference.py): fp32 to cosine >= 0.99999,
    bf16 to >= 0.999; batching with a long text (padding) changes nothing."""
    ref = json.loads((Path(__file__).parent / "data/mpnet_reference.json").read_text())
    texts, expected = ref["texts"], np.array(ref["vectors"])
    settings = Settings(model_cache_dir=mpnet_cache)
    encoder = TorchMpnet(settings, bf16=False)  # one model load for the fp32 checks
    fp32 = np.array(encoder.embed(texts))
    bf16 = np.array(TorchMpnet(settings, bf16=True).embed(texts))
    assert fp32.shape == (len(texts), 768)
    assert (fp32 * expected).sum(axis=1).min() > 0.99999
    assert (bf16 * expected).sum(axis=1).min() > 0.999
    alone = np.array(encoder.embed(texts[:1]))[0]
    assert float(alone @ expected[0]) > 0.99999
    with pytest.raises(ValueError, match="more than 384 word pieces"):
        encoder.embed(["word " * 500])


@needs_mpnet
def test_store_built_with_mpnet_is_queried_with_mpnet(mpnet_cache, tmp_path, seed_titles):
    """An index remembers its model (and its keyword stems): later commands use it without
    RAG_EMBED_MODEL, and an explicit different model is refused with the fix. 19 seed papers
    (STACKELBERG_FILE): mpnet ingests ~23 chunks/s."""
    store = tmp_path / "store"
    built = RAG(store_dir=store, embed_model="all-mpnet-base-v2", model_cache_dir=mpnet_cache)
    assert built.ingest([STACKELBERG_FILE], include_corpus=False).new_papers == 19
    assert built.stats()["embedding_model"] == "all-mpnet-base-v2"
    # What measured best with it (docs/retrieval.md): Snowball stems for its keyword index, recorded
    # with it.
    assert (
        built.store.keyword_stemmer() == "snowball"
        and built.store.keyword_index().stemmer == "snowball"
    )
    later = RAG(store_dir=store, model_cache_dir=mpnet_cache, llm="none")
    assert later.settings.embed_model == "all-mpnet-base-v2"
    hits = later.search(
        "Which paper treats the layers of a network and their learning rates as a "
        "leader-follower game?",
        k=3,
        mode="dense",
    )
    assert len(later.embedder.embed_query("x")) == 768
    assert any("Stackelberg" in seed_titles[h.paper_id] for h in hits), [
        seed_titles[h.paper_id] for h in hits
    ]
    with pytest.raises(StoreError, match="set RAG_EMBED_MODEL=all-mpnet-base-v2"):
        RAG(store_dir=store, embed_model="all-MiniLM-L6-v2").search("learning rates")


@pytest.mark.slow
def test_an_app_passes_its_own_llamaindex_embedding(tmp_path):
    """`RAG(embedder=<LlamaIndex BaseEmbedding>)` indexes and searches with it; the index records
    it, and the default model is then refused there. The BaseEmbedding runs the bundled MiniLM (a
    real model), one text at a time as LlamaIndex calls it: 19 seed papers (PALIMPSA_FILE), a
    quarter of the seeds' time."""
    from llama_index.core.base.embeddings.base import BaseEmbedding

    minilm = OnnxMiniLM()

    class AppEmbedding(BaseEmbedding):
        def _get_text_embedding(self, text: str) -> list[float]:
            # not unit length: normalised
            return [2 * x for x in minilm.embed([text], truncate=True)[0]]

        def _get_query_embedding(self, query: str) -> list[float]:
            return minilm.embed_query(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_query_embedding(query)

    store = tmp_path / "s"
    r = RAG(store_dir=store, embedder=AppEmbedding(model_name="app-minilm"))
    assert r.ingest([PALIMPSA_FILE], include_corpus=False).new_papers == 19
    assert r.stats()["embedding_model"] == "llamaindex:AppEmbedding:app-minilm"
    hits = r.search("Bayesian metaplasticity in attention, compared with Mamba2", k=3)
    assert hits[0].paper_id == "wKMV7mXjUr" and 0.3 < hits[0].score <= 1.0
    with pytest.raises(
        StoreError, match="was built with embedding model 'llamaindex:AppEmbedding:app-minilm'"
    ):
        RAG(store_dir=store).search("Palimpsa")
