"""Answering, given its parts: the settings, the embedder, the chat backend, the store, the hits and
their sources. `respond` decides between the three answers: an abstention (nothing retrieved is
close enough, the question names something no indexed paper mentions, or papers outside the index
match it far better: rag/answer/background.py), an extractive answer (sentences quoted from the
abstracts: rag/answer/extractive.py) and a generated one (the LLM's, streamed, renumbered as it
arrives, its citations checked: evidence-first, rag/answer/evidence_answer.py, or free-form,
rag/answer/free.py; what the two share is rag/answer/generation.py). Any failure of the LLM endpoint
becomes an extractive answer with `error` set, so the sources are still shown. The question itself
(validation, follow-ups made standalone) is rag/answer/question.py's.

Answers stream: each function that produces one is a generator that yields the text pieces (`str`)
and returns the final `Answer`; `rag.models.AnswerStream` wraps it for callers.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

from rag import prompts
from rag.answer.answer_type import unwritten_names
from rag.answer.background import uncovered
from rag.answer.evidence import is_list_question
from rag.answer.evidence_answer import generated_evidence
from rag.answer.extractive import extractive
from rag.answer.free import generated
from rag.answer.generation import ReadingClock, on_the_subject
from rag.answer.question import LLMGetter
from rag.answer.topic_terms import absent_from, named
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
    if should_abstain(settings, store, query, hits):
        answer = Answer(
            question=question,
            answer=prompts.ABSTAIN_ANSWER,
            abstained=True,
            abstained_by="retrieval",
            mode=mode,
            sources=sources,
        )
        yield answer.answer
        return answer
    # After the topic check, whose answer names what is missing (and quotes the closest sentences
    # when the papers are on the subject): the library rule holds back the uncovered topics whose
    # words the papers write.
    absent = absent_from(question, hits) if settings.topic_check else []
    if (
        settings.background_check
        and not absent
        and uncovered(
            embedder.model_id,
            embedder.embed_query(query),
            hits,
            is_list_question(question),
            settings.background_margin,
        )
    ):
        answer = Answer(
            question=question,
            answer=prompts.BACKGROUND_ANSWER,
            abstained=True,
            abstained_by="background",
            mode=mode,
            sources=sources,
        )
        yield answer.answer
        return answer
    if llm is None:
        answer = extractive(embedder, question, query, hits, sources)
        on_subject = on_the_subject(hits, settings.not_stated_threshold)
        if absent and not answer.abstained:
            answer = _held_back(
                answer,
                prompts.ABSENT_TOPIC_LEAD,
                prompts.ABSENT_TOPIC_ANSWER,
                absent,
                on_subject,
                sources,
                "topic",
            )
        elif settings.answer_type_check and not answer.abstained and not is_list_question(question):
            # As for the model's answers (rag/answer/evidence_answer.py): quotes from papers none of
            # which writes a name the question asks about are about other work.
            texts = {h.paper.paper_id: h.title_and_abstract for h in hits}
            unwritten = unwritten_names(
                question,
                [texts[s.paper_id] for s in answer.sources if s.cited and s.paper_id in texts],
            )
            if unwritten:
                answer = _held_back(
                    answer,
                    prompts.UNWRITTEN_NAMES_LEAD,
                    prompts.UNWRITTEN_NAMES_ANSWER,
                    unwritten,
                    on_subject,
                    sources,
                    "answer_names",
                )
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


def _held_back(
    answer: Answer,
    lead: str,
    refusal: str,
    terms: list[str],
    on_subject: bool,
    sources: list[Source],
    by: Literal["topic", "answer_names"],
) -> Answer:
    """An extractive answer to a question whose topic term or name none of the papers holds
    (rag/answer/topic_terms.py), or none of the quoted papers writes (rag/answer/answer_type.py):
    said first, in `lead` or `refusal` naming the `terms`; the quotes stay, as the closest the
    papers come, when they are on the subject (`not_stated`), else the refusal (`not_covered`) with
    the retrieved `sources`, none cited."""
    if not on_subject:
        return Answer(
            question=answer.question,
            answer=refusal.format(terms=named(terms)),
            abstained=True,
            abstained_by=by,
            mode="extractive",
            sources=sources,
        )
    quotes = answer.answer.partition("\n")[2]
    return answer.model_copy(
        update={
            "answer": f"{lead.format(terms=named(terms))}\n{quotes}",
            "outcome": "not_stated",
            "abstained": True,
            "abstained_by": by,
        }
    )


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
