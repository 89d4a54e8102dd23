"""Embedders: what callers may use of one (`Embedder`), the one registry of embedding model names
(`known_model`, `make_embedder`), and the choice of runtime for an ingest (`ingest_embedder`).

One module per family: `onnx` (the default minilm-l6-ml-v1, and all-MiniLM-L6-v2),
`torch_encoders`, `nomic`, `openai_compat`, `sentence_transformers`. Heavy imports happen inside
functions, and a family's module loads only when one of its models is made, so `rag --help` stays
fast and the default embedder never imports torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rag.backends.embedders.nomic_files import NOMIC_EMBED_MODEL
from rag.config import MINILM_EMBED_MODEL, MINILM_MAX_TOKENS, ML_EMBED_MODEL, MPNET_EMBED_MODEL
from rag.errors import StoreError

if TYPE_CHECKING:
    from rag.config import Settings

# Below this many abstracts, loading torch (~2.5 s) costs more than bf16 saves over ONNX.
BULK_EMBED_MIN_PAPERS = 300


@runtime_checkable
class Embedder(Protocol):
    """What the engine, ingest, retrieval and the citation check use of an embedding model."""

    @property
    def model_id(self) -> str:
        """The RAG_EMBED_MODEL name it was made from; recorded in the index, which refuses
        another."""
        ...

    @property
    def max_tokens(self) -> int | None:
        """The model's window in its own tokens (special tokens included) that chunks must fit;
        None when unknown (an endpoint), and then chunks are cut to MINILM_MAX_TOKENS."""
        ...

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens per text, as the model counts them against `max_tokens`."""
        ...

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        """Unit vectors, one per text; `truncate` cuts texts to the window (for scoring sentences,
        never for the index, whose texts must already fit)."""
        ...

    def embed_query(self, text: str) -> list[float]:
        """The unit vector of a question."""
        ...


# ---- the registry of embedding model names ---------------------------------------------------

EmbedderFactory = Callable[["Settings"], Embedder]


def _onnx_minilm(settings: Settings) -> Embedder:
    from rag.backends.embedders.onnx import OnnxMiniLM

    return OnnxMiniLM()


def _onnx_minilm_ml(settings: Settings) -> Embedder:
    from rag.backends.embedders.onnx import OnnxMiniLM

    return OnnxMiniLM(ML_EMBED_MODEL)


def _torch_mpnet(settings: Settings) -> Embedder:
    from rag.backends.embedders.torch_encoders import TorchMpnet

    return TorchMpnet(settings)


def _torch_nomic(settings: Settings) -> Embedder:
    from rag.backends.embedders.nomic import NomicEmbed

    return NomicEmbed(settings)


def _openai_compat(settings: Settings) -> Embedder:
    from rag.backends.embedders.openai_compat import OpenAIEmbedder

    return OpenAIEmbedder(settings)


def _sentence_transformers(settings: Settings) -> Embedder:
    from rag.backends.embedders.sentence_transformers import SentenceTransformersEmbedder

    return SentenceTransformersEmbedder(settings)


# Every embedding model this version can load, by RAG_EMBED_MODEL: a model by its name, or a
# prefix followed by the provider's own name for a model. The one list of them: `make_embedder` and
# `known_model` read it, and the rest of rag asks `known_model`.
MODELS: dict[str, EmbedderFactory] = {
    ML_EMBED_MODEL: _onnx_minilm_ml,
    MINILM_EMBED_MODEL: _onnx_minilm,
    MPNET_EMBED_MODEL: _torch_mpnet,
    NOMIC_EMBED_MODEL: _torch_nomic,
}
PREFIXES: dict[str, EmbedderFactory] = {"openai:": _openai_compat, "st:": _sentence_transformers}


def _factory(name: str) -> EmbedderFactory | None:
    if name in MODELS:
        return MODELS[name]
    return next((make for prefix, make in PREFIXES.items() if name.startswith(prefix)), None)


def known_model(name: str) -> bool:
    """Whether this version can load an embedding model by this name."""
    return _factory(name) is not None


def _choices() -> str:
    """The accepted RAG_EMBED_MODEL values, for an error message: "'a', 'b', 'openai:<model>' or
    'st:<model>'"."""
    names = [f"'{name}'" for name in MODELS] + [f"'{prefix}<model>'" for prefix in PREFIXES]
    return ", ".join(names[:-1]) + " or " + names[-1]


_EMBEDDERS: dict[Hashable, Embedder] = {}
_EMBEDDERS_LOCK = threading.Lock()


def make_embedder(settings: Settings) -> Embedder:
    """The embedder named by `settings.embed_model` (one shared instance per configuration)."""
    name = settings.embed_model
    key = (name, settings.embed_base_url, settings.openai_base_url)
    with _EMBEDDERS_LOCK:
        if key in _EMBEDDERS:
            return _EMBEDDERS[key]
        make = _factory(name)
        if make is None:
            raise StoreError(
                f"unknown embedding model {name!r}; set RAG_EMBED_MODEL to {_choices()}"
            )
        embedder = make(settings)
        _EMBEDDERS[key] = embedder
        return embedder


def ingest_embedder(settings: Settings, embedder: Embedder, papers: int) -> Embedder:
    """The embedder to index `papers` new abstracts with: bf16 torch for big ingests where it helps.

    Both runtimes run the same all-MiniLM-L6-v2, so their vectors share one index; minilm-l6-ml-v1
    (the default) runs on ONNX only, in bulk for big ingests (no torch weights ship for it); any
    other model (openai:, st:) is used as configured.
    """
    from rag.backends.embedders import torch_encoders
    from rag.backends.embedders.onnx import OnnxMiniLM, OnnxMiniLMBulk

    backend = settings.embed_backend
    if not isinstance(embedder, OnnxMiniLM):
        return embedder
    if embedder.model_id != MINILM_EMBED_MODEL:
        if papers < BULK_EMBED_MIN_PAPERS or isinstance(embedder, OnnxMiniLMBulk):
            return embedder
        return _shared(("onnx-bulk", embedder.model_id, embedder.files), embedder.bulk)
    if backend == "torch" or (
        backend != "onnx"
        and papers >= BULK_EMBED_MIN_PAPERS
        and torch_encoders.cpu_has_bf16()
        and torch_encoders.torch_minilm_available()
    ):
        return _shared("torch-minilm", torch_encoders.TorchMiniLM)
    if papers >= BULK_EMBED_MIN_PAPERS:
        return _shared("onnx-minilm-bulk", OnnxMiniLMBulk)
    return embedder


# A model whose answers score sentences with another: the answer rules' cosine levels and the
# injection probe were measured with all-MiniLM-L6-v2, which ships beside it.
SENTENCE_SCORERS = {ML_EMBED_MODEL: MINILM_EMBED_MODEL}


def sentence_scorer(embedder: Embedder) -> Embedder:
    """The embedder an answer scores source sentences and questions with: `embedder`, unless its
    model names another in SENTENCE_SCORERS."""
    from rag.backends.embedders.onnx import OnnxMiniLM

    other = SENTENCE_SCORERS.get(embedder.model_id)
    if other is None:
        return embedder
    return _shared(("scorer", other), lambda: OnnxMiniLM(other))


def _shared(key: Hashable, factory: Callable[[], Embedder]) -> Embedder:
    """One instance per key for the process, made by `factory` the first time."""
    with _EMBEDDERS_LOCK:
        if key not in _EMBEDDERS:
            _EMBEDDERS[key] = factory()
        return _EMBEDDERS[key]


__all__ = [
    "BULK_EMBED_MIN_PAPERS",
    "MINILM_MAX_TOKENS",
    "MODELS",
    "PREFIXES",
    "Embedder",
    "EmbedderFactory",
    "ingest_embedder",
    "known_model",
    "make_embedder",
    "sentence_scorer",
]
