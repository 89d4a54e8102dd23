"""The extractive answer: the sentences of the top papers closest to the question, quoted with their
[n]. The answer without an LLM, and the fallback of a generated one when the LLM fails
(rag/answer/generation.py).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rag import prompts
from rag.answer.citations import escape_quote, renumber_sources, split_sentences
from rag.answer.injection import Embed, instruction_sentences, probe_embed
from rag.answer.rules.answer_type import unwritten_names
from rag.models import Answer, Citation, Source

if TYPE_CHECKING:
    from rag.backends.embedders import Embedder
    from rag.retrieve.search import Hit


# Sentences that say where the code is, not what the paper found.
BOILERPLATE = re.compile(
    r"https?://|github\.com|\b(?:code|data|dataset|models?) (?:is|are) (?:publicly"
    r" )?(?:available|released)",
    re.I,
)


def extractive(
    embedder: Embedder,
    question: str,
    query: str,
    hits: list[Hit],
    sources: list[Source],
    error: str | None = None,
    boilerplate: bool = True,
) -> Answer:
    """Quote the sentences of the top papers closest to the question, each with its [n]. With
    `error` (why the LLM failed), the fallback of a generated answer. `boilerplate`: the rule that
    quotes no boilerplate sentence is on."""
    candidates = quotable(question, hits, boilerplate, probe_embed(embedder))
    if not candidates:
        return Answer(
            question=question,
            answer=prompts.ABSTAIN_ANSWER,
            abstained=True,
            mode="extractive",
            sources=sources,
            error=error,
        )
    picked = _picked(embedder, query, hits, candidates)
    # Numbered here, not by parsing the text: a bracket inside a quote ("W[1]-hard") is the
    # abstract's text, kept verbatim and escaped, never a citation.
    order = list(dict.fromkeys(i for i, _ in picked))
    text = "\n".join(f"- {escape_quote(s)} [{order.index(i) + 1}]" for i, s in picked)
    renumbered = renumber_sources(sources, order)
    label = prompts.EXTRACTIVE_LABEL if error is None else prompts.FALLBACK_LABEL
    # Quoted sentences support themselves: every citation is supported.
    citations = [
        Citation(n=s.n, paper_id=s.paper_id, supported=True) for s in renumbered if s.cited
    ]
    quoted = {
        s.paper_id: [q for i, q in picked if sources[i - 1].paper_id == s.paper_id]
        for s in renumbered
    }
    abstracts = {h.paper.paper_id: h.chunk.abstract for h in hits}
    # A quote may come from another chunk of the abstract than the one retrieved: the passage shown
    # for a citation is then the abstract, the text that holds it.
    renumbered = [
        s.model_copy(
            update={"evidence": quoted[s.paper_id]}
            | (
                {"passage": abstracts[s.paper_id]}
                if any(q not in s.passage for q in quoted[s.paper_id])
                else {}
            )
        )
        for s in renumbered
    ]
    return Answer(
        question=question,
        answer=f"{label}\n{text}",
        mode="extractive",
        citations=citations,
        sources=renumbered,
        grounding=1.0,
        error=error,
    )


def quotable(
    question: str, hits: list[Hit], boilerplate: bool, probe: Embed | None = None
) -> list[tuple[int, str]]:
    """The sentences that may be quoted, each with its source's number: the top papers' (those that
    write a name the question asks about, when any does). `probe`: vectors for the injection
    probe."""
    # A question naming something ("the two pretraining objectives in NAVI") is answered from the
    # papers that write it, when any does: the sentences closest to its other words may be another
    # paper's.
    asked = unwritten_names(question, [])
    writers = {
        i
        for i, h in enumerate(hits[:5], 1)
        if asked and unwritten_names(question, [h.title_and_abstract]) != asked
    }
    candidates: list[tuple[int, str]] = []
    for i, hit in enumerate(hits[:5], 1):
        if writers and i not in writers:
            continue
        # Never quote an instruction planted in an abstract (rag/answer/injection.py), nor a
        # sentence on code.
        dropped = instruction_sentences(hit.chunk.abstract, embed=probe)
        candidates.extend(
            (i, s)
            for s, bad in list(zip(split_sentences(hit.chunk.abstract), dropped))[:12]
            if len(s) > 30 and not bad and not (boilerplate and BOILERPLATE.search(s))
        )
    return candidates


FIT_SHARE = (
    0.6  # a sentence scoring under this share of the best one is not quoted: off the question
)


def fit_scores(embedder: Embedder, query: str, n_hits: int, candidates: list[tuple[int, str]]):
    """Each candidate sentence's closeness to the query (cosine), with a small bonus for the
    better-ranked papers: how the extractive answer chooses what to quote."""
    import numpy as np

    vectors = np.array(embedder.embed([s for _, s in candidates], truncate=True))
    q = np.array(embedder.embed_query(query))
    rank_bonus = {i: 0.05 * (n_hits - i) / max(n_hits, 1) for i in range(1, n_hits + 1)}
    return vectors @ q + np.array([rank_bonus[i] for i, _ in candidates])


def _picked(
    embedder: Embedder, query: str, hits: list[Hit], candidates: list[tuple[int, str]]
) -> list[tuple[int, str]]:
    """The candidates closest to the query (a small bonus for the better-ranked papers): at most
    four, two a paper, none under `FIT_SHARE` of the best score."""
    import numpy as np

    scores = fit_scores(embedder, query, len(hits), candidates)
    picked: list[tuple[int, str]] = []
    per_paper: dict[int, int] = {}
    best = float(scores.max())
    for j in np.argsort(-scores):
        i, sentence = candidates[j]
        if scores[j] < FIT_SHARE * best or len(picked) >= 4:
            break
        if per_paper.get(i, 0) >= 2:
            continue
        per_paper[i] = per_paper.get(i, 0) + 1
        picked.append((i, sentence))
    return picked
