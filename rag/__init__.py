"""Paper Q&A with citations you can trust: `rag.ask("...")`, or `RAG(...)` for more control."""

from __future__ import annotations

from .config import Settings
from .engine import RAG
from .errors import CorpusError, InputError, LLMError, RagError, StoreError
from .models import Answer, Citation, Source, Usage

__all__ = [
    "Answer",
    "Citation",
    "CorpusError",
    "InputError",
    "LLMError",
    "RAG",
    "RagError",
    "Settings",
    "Source",
    "StoreError",
    "Usage",
    "ask",
    "search",
]

_default: RAG | None = None


def _shared() -> RAG:
    global _default
    if _default is None:
        _default = RAG()
    return _default


def ask(question: str, k: int | None = None, mode: str | None = None, llm: bool = True) -> Answer:
    """Answer a question over the default index (built from `corpus/` on first use)."""
    return _shared().ask(question, k=k, mode=mode, llm=llm)


def search(query: str, k: int | None = None, mode: str | None = None) -> list[Source]:
    """The top-k papers for a query over the default index."""
    return _shared().search(query, k=k, mode=mode)
