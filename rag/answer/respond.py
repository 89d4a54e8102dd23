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
from rag.answer.evidence import is_list_question
from rag.answer.evidence_answer import generated_evidence
from rag.answer.extractive import extractive
from rag.answer.free import generated
from rag.answer.generation import ReadingClock, on_the_subject
from rag.answer.outcome import held_back_quotes, not_covered
from rag.answer.question import LLMGetter
from rag.answer.rules import active
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
    mode: Literal["llm", "extractive"] = "extractive" if llm is None else "llm"
    on = active(settings)  # the rules on (rag/answer/rules/__init__.py)
    if should_abstain(settings, store, query, hits) if "retrieval" in on else not hits:
        answer = not_covered(question, mode, "retrieval", prompts.ABSTAIN_ANSWER, sources)
        yield answer.answer
        return answer
    # After the topic check, whose answer names what is missing (and quotes the closest sentences
    # when the papers are on the subject): the library rule holds back the uncovered topics whose
    # words the papers write.
    absent = absent_from(question, hits) if "topic" in on else []
    if (
        "background" in on
        and not absent
        and uncovered(
            embedder.model_id,
            embedder.embed_query(query),
            hits,
            is_list_question(question),
            settings.background_margin,
        )
    ):
        answer = not_covered(question, mode, "background", prompts.BACKGROUND_ANSWER, sources)
        yield answer.answer
        return answer
    if llm is None:
        answer = extractive(
            embedder, question, query, hits, sources, boilerplate="boilerplate" in on
        )
        on_subject = "on_subject" in on and on_the_subject(hits, settings.not_stated_threshold)
        if absent and not answer.abstained:
            answer = held_back_quotes(answer, "topic", absent, on_subject, sources)
        elif "answer_names" in on and not answer.abstained and not is_list_question(question):
            # As for the model's answers (rag/answer/evidence_answer.py): quotes from papers none of
            # which writes a name the question asks about are about other work.
            texts = {h.paper.paper_id: h.title_and_abstract for h in hits}
            unwritten = unwritten_names(
                question,
                [texts[s.paper_id] for s in answer.sources if s.cited and s.paper_id in texts],
            )
            if unwritten:
                answer = held_back_quotes(answer, "answer_names", unwritten, on_subject, sources)
        yield answer.answer
        return answer
    # The generated answers start with an empty piece (`Reading`): the sources are found and the
    # model starts reading them, which takes seconds on a CPU before its first word; the CLI and the
    # UI show it.
    if settings.answer_style == "evidence":
        return (
            yield from generated_evidence(
                settings, embedder, llm, question, query, hits, sources, clock, absent=absent
            )
        )
    return (yield from generated(settings, embedder, llm, question, query, hits, sources, clock))
