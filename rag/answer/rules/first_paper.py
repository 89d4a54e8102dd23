"""The first-paper rule (rag/answer/rules/__init__.py): a single answer is the answer of the paper
retrieval ranked first. One that cites none of it is `not_stated`, quoting that paper's sentence
closest to the question; one that cites it quotes another paper only when that paper is as close to
the question (dense similarity) or holds a name of the question few papers write.

Retrieval ranks the papers by how well each fits the whole question; a small model that answers
only from papers ranked lower has mostly answered from a paper that merely shares words with it:
asked to name the paper a description fits, the local model cited none of the first-ranked paper in
21 answers, 20 of them wrong; and beside the first paper it quoted papers further from the question
that did not fit it (docs/lab/answers-history.md#the-paper-a-description-fits). Lists are the list
rule's (rag/answer/rules/list_fit.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rag.retrieve.search import Hit

FIRST = 1  # the source number of the paper retrieval ranked first
# Beside the first paper, a single answer cites papers at least this share of its cosine to the
# question: of the 18 sentences quoted beside it from papers less close than it, in 80 answers to
# descriptions, a reader found none on the question.
CLOSE_SHARE = 1.0


def cites_first(cited: Iterable[int]) -> bool:
    """Whether the source numbers an answer cites (its quotes', its claims') include the first."""
    return FIRST in set(cited)


def beside_first(hits: list[Hit]) -> set[int]:
    """The papers (1-based, in `hits` order) a single answer citing the first may cite: the first,
    those at least as close to the question as it (their passage's cosine; unknown: kept), and
    those holding a rare term of the question, a name few papers write ("how does X compare with
    Y?": Y's paper, further in meaning)."""
    if not hits:
        return set()
    first = hits[0].cosine
    return {
        n
        for n, hit in enumerate(hits, start=1)
        if n == FIRST
        or hit.named
        or hit.cosine is None
        or first is None
        or hit.cosine >= CLOSE_SHARE * first
    }
