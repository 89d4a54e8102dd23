"""The list rule (rag/answer/rules/__init__.py): a "which papers" list the model writes holds only
papers that fit the question as the extractive answer judges fit, a paper whose closest sentence
scores at least `FIT_SHARE` of the best sentence of any paper (rag/answer/extractive.py). A small
model lists every paper it was shown; the extractive list leaves out those far from the question.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.answer.extractive import FIT_SHARE, fit_scores, quotable
from rag.answer.injection import probe_embed

if TYPE_CHECKING:
    from rag.backends.embedders import Embedder
    from rag.retrieve.search import Hit


def fitting(
    embedder: Embedder, question: str, query: str, hits: list[Hit], boilerplate: bool = True
) -> set[int]:
    """The numbers (1-based, in `hits` order) of the papers that fit the question."""
    candidates = quotable(question, hits, boilerplate, probe_embed(embedder))
    if not candidates:
        return set()
    scores = fit_scores(embedder, query, len(hits), candidates)
    best = float(scores.max())
    return {i for (i, _), score in zip(candidates, scores) if score >= FIT_SHARE * best}
