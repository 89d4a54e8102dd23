"""The premise rule (rag/answer/rules/__init__.py): a single answer does not quote an abstract's
premise, the sentences before the one that says what the paper does ("We propose ...", "In this
work ..."): they state the field's problem or prior work, true but not the paper's answer. In a
reader's audits 6 of 68 such quotes answered the question, against 154 of 238 quotes from the rest
of the abstracts (docs/lab/answers-history.md#the-abstracts-premise). Beside another sentence of the
paper a premise quote is dropped; a paper quoted only from its premise (the model named the problem
a paraphrased question describes) is quoted instead by its sentence past the premise closest to the
question, the one that says what the paper does about it. The turn sentence itself ("We propose X")
is quoted with the sentence after it, which most often says how.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rag.answer.evidence import Embed, source_sentences

if TYPE_CHECKING:
    from rag.retrieve.search import Hit

# Where an abstract turns from its premise to the paper: its authors speak ("we", "our"), or it
# names the paper ("this paper", "here").
_THE_PAPER = re.compile(r"\b(?:we|our|us|this (?:paper|work|study|article)|here)\b", re.I)


@functools.lru_cache(maxsize=256)
def _turn(abstract: str) -> tuple[list[str], int | None]:
    """The sentences of `abstract`, as a model reads and quotes them (rag/answer/evidence.py), and
    the index of the first that says what the paper does (None when none does: the abstract's
    structure is unknown)."""
    sentences = source_sentences(abstract)
    return sentences, next((i for i, s in enumerate(sentences) if _THE_PAPER.search(s)), None)


@functools.lru_cache(maxsize=256)
def premise(abstract: str) -> frozenset[str]:
    """The sentences of `abstract` before the first that says what the paper does (none when no
    sentence does)."""
    sentences, turn = _turn(abstract)
    return frozenset(sentences[: turn or 0])


def without_premise(
    quotes: list[tuple[int, str]],
    hits: list[Hit],
    shown: Sequence[Sequence[str]],
    question: str,
    embed: Embed,
) -> list[tuple[int, str]]:
    """`quotes` (source number, sentence) without those from their paper's premise; a paper
    quoted from its premise alone is quoted by the sentence of it shown to the model (`shown`, by
    source) past the premise closest to `question` (by `embed`); as it was when none is shown."""
    inside = {
        (n, q)
        for n, q in quotes
        if 0 < n <= len(hits) and " ".join(q.split()) in premise(hits[n - 1].chunk.abstract)
    }
    rest = {n for n, q in quotes if (n, q) not in inside}
    out: list[tuple[int, str]] = []
    for n, q in quotes:
        if (n, q) not in inside:
            out.append((n, q))
        elif n not in rest:
            own = [
                s
                for s in (shown[n - 1] if n <= len(shown) else [])
                if " ".join(s.split()) not in premise(hits[n - 1].chunk.abstract)
            ]
            if not own:
                out.append((n, q))
            elif all(m != n for m, _ in out):  # the paper's own sentence, once
                out.append((n, _closest(question, own, embed)))
    return _with_the_how(out, hits, shown)


def _with_the_how(
    quotes: list[tuple[int, str]], hits: list[Hit], shown: Sequence[Sequence[str]]
) -> list[tuple[int, str]]:
    """`quotes` with, after a paper's turn sentence (the first past its premise: "We propose X, a
    framework for ..."), the sentence that follows it in the abstract when it was shown: the turn
    names the paper's idea, the next sentence most often says how ("We realize this design
    through ...")."""
    out: list[tuple[int, str]] = []
    quoted = {(n, " ".join(q.split())) for n, q in quotes}
    for n, q in quotes:
        out.append((n, q))
        if not 0 < n <= min(len(hits), len(shown)):
            continue
        sentences, turn = _turn(hits[n - 1].chunk.abstract)
        if turn is None or turn + 1 >= len(sentences) or " ".join(q.split()) != sentences[turn]:
            continue
        if (n, sentences[turn + 1]) in quoted:
            continue
        after = [s for s in shown[n - 1] if " ".join(s.split()) == sentences[turn + 1]]
        if after:
            out.append((n, after[0]))
            quoted.add((n, sentences[turn + 1]))
    return out


def _closest(question: str, sentences: list[str], embed: Embed) -> str:
    import numpy as np

    vectors = np.asarray(embed([question, *sentences]), dtype=np.float32)
    return sentences[int(np.argmax(vectors[1:] @ vectors[0]))]
