"""Paper Q&A with citations you can trust: `rag.ask("...")`, or `RAG(...)` for more control."""

from __future__ import annotations

import threading
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version

from rag.answer.injection import PLACEHOLDER, UNTRUSTED_NOTE, guarded_source
from rag.backends.chat import Cancellation, ChatModel, GenerationCancelled, read_in_thread
from rag.backends.embedders import Embedder
from rag.config import Settings
from rag.engine import RAG
from rag.errors import CorpusError, InputError, LLMError, RagError, StoreError
from rag.index.corpus import Paper
from rag.index.vectors import CollectionShared
from rag.models import (
    Answer,
    AnswerStream,
    Citation,
    IngestReport,
    Reading,
    RetrievalScores,
    Source,
    Usage,
    Writing,
)
from rag.paper_map.layout import PaperMap

try:
    __version__ = _package_version("rag-papers")
except PackageNotFoundError:  # a checkout on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Answer",
    "AnswerStream",
    "Cancellation",
    "ChatModel",
    "Citation",
    "CollectionShared",
    "CorpusError",
    "Embedder",
    "GenerationCancelled",
    "IngestReport",
    "InputError",
    "LLMError",
    "PLACEHOLDER",
    "Paper",
    "PaperMap",
    "RAG",
    "RagError",
    "Reading",
    "RetrievalScores",
    "Settings",
    "Source",
    "StoreError",
    "UNTRUSTED_NOTE",
    "Usage",
    "Writing",
    "ask",
    "guarded_source",
    "read_in_thread",
    "search",
]

_engines: dict[str, RAG] = {}
_engines_lock = threading.Lock()


def _engine(settings: Settings | None) -> RAG:
    """One `RAG` per distinct settings (the default ones when None), kept for later calls: loading
    the embedding model and opening the store happen once."""
    key = "" if settings is None else settings.model_dump_json()
    with _engines_lock:
        if key not in _engines:
            _engines[key] = RAG(settings)
        return _engines[key]


def ask(
    question: str,
    k: int | None = None,
    mode: str | None = None,
    llm: bool = True,
    settings: Settings | None = None,
) -> Answer:
    """Answer a question over the default index (built from the seed corpus on first use), or over
    the index and models `settings` names."""
    return _engine(settings).ask(question, k=k, mode=mode, llm=llm)


def search(
    query: str, k: int | None = None, mode: str | None = None, settings: Settings | None = None
) -> list[Source]:
    """The top-k papers for a query over the default index, or the one `settings` names."""
    return _engine(settings).search(query, k=k, mode=mode)
