"""Answering, given its parts: the settings, the embedder, the chat backend, the store, the hits and
their sources. `respond` decides between the three answers: an abstention (nothing retrieved is
close enough, the question names something no indexed paper mentions, or papers outside the index
match it far better: rag/answer/rules/background.py), an extractive answer (sentences quoted from
the abstracts: rag/answer/extractive.py) and a generated one (the LLM's, streamed, renumbered as it
arrives, its citations checked: evidence-first, rag/answer/evidence_answer.py, or free-form,
rag/answer/free.py; what the two share is rag/answer/generation.py). Any failure of the LLM endpoint
becomes an extractive answer with `error` set, so the sources are still shown. The question itself
(validation, follow-ups made standalone) is rag/answer/question.py's. Every rule that holds an
answer back is a row of the table in rag/answer/rules/__init__.py, in the order it runs (the gates
here, the checks in the answer paths), and every held-back answer is built by rag/answer/outcome.py.

Answers stream: each function that produces one is a generator that yields the text pieces (`str`)
and returns the final `Answer`; `rag.models.AnswerStream` wraps it for callers.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

from rag import prompts
from rag.answer.case import Case
from rag.answer.evidence_answer import generated_evidence
from rag.answer.extractive import extractive
from rag.answer.free import generated
from rag.answer.generation import ReadingClock
from rag.answer.outcome import held_back_quotes, not_covered
from rag.answer.question import LLMGetter
from rag.answer.rules.answer_type import unwritten_names
from rag.answer.rules.background import uncovered
from rag.answer.rules.retrieval import should_abstain
from rag.answer.rules.topic import absent_from
from rag.config import Settings
from rag.models import Answer, Source

if TYPE_CHECKING:
    from rag.backends.embedders import Embedder
    from rag.index.store import Store
    from rag.retrieve.search import Hit


def respond(
    settings: Settings,
    store: Store,
    embedder: Embedder,
    llm: LLMGetter | None,
    question: str,
    query: str,
    hits: list[Hit],
    sources: list[Source],
    clock: ReadingClock | None = None,
) -> Generator[str, None, Answer]:
    """Yield the answer's text as it is produced and return the `Answer`: an abstention, the
    extractive answer (`llm` None) or the LLM's. `query` is what was retrieved with (the rewritten
    follow-up). With an LLM, an empty piece comes first: the sources are found and the model starts
    reading them."""
    case = Case.read(settings, embedder, question, query, hits, sources)
    mode: Literal["llm", "extractive"] = "extractive" if llm is None else "llm"
    on = case.on  # the rules on (rag/answer/rules/__init__.py)
    if should_abstain(settings, store, query, hits) if "retrieval" in on else not hits:
        answer = not_covered(case, mode, "retrieval", prompts.ABSTAIN_ANSWER)
        yield answer.answer
        return answer
    # After the topic check, whose answer names what is missing (and quotes the closest sentences
    # when the papers are on the subject): the library rule holds back the uncovered topics whose
    # words the papers write.
    absent = absent_from(case.question, hits) if "topic" in on else []
    if (
        "background" in on
        and not absent
        and uncovered(
            embedder.model_id,
            embedder.embed_query(query),
            hits,
            case.list_question,
            settings.background_margin,
        )
    ):
        answer = not_covered(case, mode, "background", prompts.BACKGROUND_ANSWER)
        yield answer.answer
        return answer
    if llm is None:
        answer = _extractive(case, absent)
        yield answer.answer
        return answer
    # The generated answers start with an empty piece (`Reading`): the sources are found and the
    # model starts reading them, which takes seconds on a CPU before its first word; the CLI and the
    # UI show it.
    if settings.answer_style == "evidence":
        return (yield from generated_evidence(case, llm, clock, absent=absent))
    return (yield from generated(case, llm, clock))


def _extractive(case: Case, absent: list[str]) -> Answer:
    """The extractive answer, held back (the lead naming the terms, the quotes kept when the papers
    are on the subject) by the topic rule's `absent` terms or a name no quoted paper writes."""
    on, hits = case.on, case.hits
    answer = extractive(
        case.embedder,
        case.question,
        case.query,
        hits,
        case.sources,
        boilerplate="boilerplate" in on,
    )
    if absent and not answer.abstained:
        return held_back_quotes(case, answer, "topic", absent, case.on_subject())
    if "answer_names" in on and not answer.abstained and not case.list_question:
        # As for the model's answers (rag/answer/evidence_answer.py): quotes from papers none of
        # which writes a name the question asks about are about other work.
        texts = {h.paper.paper_id: h.title_and_abstract for h in hits}
        unwritten = unwritten_names(
            case.question,
            [texts[s.paper_id] for s in answer.sources if s.cited and s.paper_id in texts],
        )
        if unwritten:
            return held_back_quotes(case, answer, "answer_names", unwritten, case.on_subject())
    return answer
