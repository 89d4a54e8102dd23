"""The parts rule (rag/answer/rules/__init__.py): a question that asks two things ("How does X
evaluate models, and how do top models fare?", rag/answer/question.py's `asks`) gets evidence for
each: for a part no quoted sentence answers, the cited papers' sentence that does is quoted too;
a part none of them answers is named in the answer as not stated. A sentence answers a part when
it is close to it in meaning (`PART_MATCH`) and gives what the part asks for (a number for "how
many", a name for "which").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rag.answer.rules.answer_type import gives_asked_type
from rag.text import keyword_terms

Embed = Callable[[list[str]], Sequence[Sequence[float]]]

PART_MATCH = 0.45  # cosine (the store's embedder) of an ask and a sentence that answers it
# Under this cosine to every sentence of the cited papers, a part is not stated there. Between the
# two, a sentence may answer it in other words: neither quoted for it nor said to be missing.
UNSTATED_BELOW = 0.3


def cover(
    parts: list[str],
    quotes: list[tuple[int, str]],
    sentences: dict[int, list[str]],
    abstracts: Sequence[str],
    embed: Embed,
) -> tuple[list[tuple[int, str]], list[str]]:
    """The sentences to quote besides `quotes` (source n, sentence), one for each part no quote
    answers, from the cited sources' `sentences` (by n); and the parts they do not state: none of
    them gives the number or name a part asks for, or none comes near it."""
    import numpy as np

    pool = [(n, s) for n, ss in sentences.items() for s in ss]
    if not pool or len(parts) < 2:
        return [], []
    texts = parts + [s for _, s in pool]
    vectors = np.asarray(embed(texts), dtype=np.float32)
    asked, said = vectors[: len(parts)], vectors[len(parts) :]
    quoted = {q for _, q in quotes}
    written = {w for _, sentence in pool for w in keyword_terms(sentence)}
    added: list[tuple[int, str]] = []
    unstated: list[str] = []
    for k, part in enumerate(parts):
        sims = said @ asked[k]
        typed = [j for j in range(len(pool)) if gives_asked_type(part, pool[j][1], abstracts)]
        # Far from every sentence, unless the sentences write each of its words ("What is NAVI":
        # a rare name the embedder reads poorly).
        far = float(sims.max()) < UNSTATED_BELOW and not set(keyword_terms(part)) <= written
        if not typed or far:
            unstated.append(part)
            continue
        answering = [j for j in sorted(typed, key=lambda j: -sims[j]) if sims[j] >= PART_MATCH]
        if answering and not any(pool[j][1] in quoted for j in answering):
            best = pool[answering[0]]
            if best not in added:
                added.append(best)
    return added, unstated
