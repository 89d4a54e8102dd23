"""The first-paper rule (rag/answer/rules/__init__.py): a single answer must cite the paper that
retrieval ranked first, else it is `not_stated`, quoting that paper's sentence closest to the
question. Retrieval ranks the papers by how well each fits the whole question; a small model that
answers only from papers ranked lower has mostly answered from a paper that merely shares words
with it: asked to name the paper a description fits, the local model cited none of the first-ranked
paper in 21 answers, 20 of them wrong (docs/lab/answers-history.md#the-paper-a-description-fits).
Lists are the list rule's (rag/answer/rules/list_fit.py).
"""

from __future__ import annotations

from collections.abc import Iterable

FIRST = 1  # the source number of the paper retrieval ranked first


def cites_first(cited: Iterable[int]) -> bool:
    """Whether the source numbers an answer cites (its quotes', its claims') include the first."""
    return FIRST in set(cited)
