"""The retrieval rule, the first gate (rag/answer/rules/__init__.py): an answer is made only from
papers close enough to the question."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.config import Settings

if TYPE_CHECKING:
    from rag.index.store import Store
    from rag.retrieve.search import Hit


def should_abstain(settings: Settings, store: Store, query: str, hits: list[Hit]) -> bool:
    """The retrieval rule: nothing retrieved, a name no indexed paper mentions, or nothing close
    enough."""
    if not hits:
        return True
    sims = [h.similarity for h in hits if h.similarity is not None]
    best = max(sims) if sims else None
    # A question about something no indexed paper mentions ("How does FlashAttention tile ...?")
    # is about a paper that is not indexed, however close the papers on the same topic are, and
    # even when another word of it is a rare name some paper uses ("How far is Proxima Centauri
    # from Earth?" among papers of which one says "Earth").
    if best is None or best < settings.unknown_name_threshold:
        unknown = store.keyword_index().unknown_names(query)
        if any(not store.has_author_named(name) for name in unknown):
            return True
    if any(h.named for h in hits):
        return False
    return best is not None and best < settings.abstain_threshold
