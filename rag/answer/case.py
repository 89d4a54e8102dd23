"""The question being answered and what was found for it, read once: `respond` makes a `Case`, and
the answer paths, the rules they call and the outcome builders take it (rather than the same eight
arguments each, and the question's form worked out again in each rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag.answer.evidence import is_list_question
from rag.answer.injection import Embed, probe_embed
from rag.answer.rules import active
from rag.config import Settings
from rag.models import Source

if TYPE_CHECKING:
    from rag.backends.embedders import Embedder
    from rag.retrieve.search import Hit


@dataclass(frozen=True)
class Case:
    """One question with its retrieved papers (`hits`, shown as `sources`), the settings and the
    embedder it is answered with. `query`: what was retrieved with (a follow-up made standalone);
    `on`: the rules on; `list_question`: it asks "which papers" (one line a paper)."""

    settings: Settings
    embedder: Embedder
    question: str
    query: str
    hits: list[Hit]
    sources: list[Source]
    on: frozenset[str]
    list_question: bool

    @classmethod
    def read(
        cls,
        settings: Settings,
        embedder: Embedder,
        question: str,
        query: str,
        hits: list[Hit],
        sources: list[Source],
    ) -> Case:
        """The case of `question`, its form and the rules on read once."""
        return cls(
            settings,
            embedder,
            question,
            query,
            hits,
            sources,
            active(settings),
            is_list_question(question),
        )

    def embed(self, texts: list[str]) -> Sequence[Sequence[float]]:
        """Unit vectors of sentences (cut to the embedder's window)."""
        return self.embedder.embed(texts, truncate=True)

    @property
    def probe(self) -> Embed | None:
        """Sentence vectors for the injection probe (rag/answer/injection.py), when the embedder is
        its model."""
        return probe_embed(self.embedder)

    def on_subject(self) -> bool:
        """Whether a held-back answer is `not_stated` (the papers are on the question's subject, the
        `on_subject` rule: `on_the_subject` below) rather than `not_covered`."""
        return "on_subject" in self.on and on_the_subject(
            self.hits, self.settings.not_stated_threshold
        )


def on_the_subject(hits: list[Hit], threshold: float) -> bool:
    """Whether the retrieved papers are on the question's subject, for an answer that does not state
    what was asked: a name of the question in one of them, or a best dense similarity of at least
    `threshold` (`not_stated_threshold`). Then the answer is `not_stated`, quoting them; else
    `not_covered`."""
    sims = [h.similarity for h in hits if h.similarity is not None]
    return any(h.named for h in hits) or (bool(sims) and max(sims) >= threshold)
