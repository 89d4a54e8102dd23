"""The free-form answer (`RAG_ANSWER_STYLE=free`): the sources' passages in the prompt, the model's
answer streamed with its markers renumbered, then checked (refusal, injection filter, support).
Apart from the evidence-first answer (rag/answer/evidence_answer.py, the default): the two share
only rag/answer/generation.py.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING

from rag import prompts
from rag.answer import evidence
from rag.answer.citations import (
    MarkerRewriter,
    check_support,
    renumber,
    renumber_sources,
    split_sentences,
)
from rag.answer.generation import (
    WRITING_EVERY,
    ReadingClock,
    complete_usage,
    is_refusal,
    llm_failed,
)
from rag.answer.injection import Embed, sanitize
from rag.answer.outcome import answered, not_covered, withdrawn
from rag.answer.question import LLMGetter
from rag.answer.rules.injection_output import CleanedAnswer, allowed_codes, clean_answer
from rag.errors import LLMError
from rag.models import Answer, Source, Usage, Writing
from rag.text import count_tiktoken, keyword_terms

if TYPE_CHECKING:
    from rag.answer.case import Case
    from rag.backends.chat import ChatModel


def trim_passages(
    question: str,
    passages: list[str],
    max_tokens: int,
    embed: Callable[[list[str]], Sequence[Sequence[float]]] | None = None,
) -> list[str]:
    """Each passage cut to about `max_tokens`: its sentences closest to the question (cosine with
    `embed`, a function from texts to unit vectors; shared words without it), kept in the abstract's
    order. Reading the prompt is most of a local model's time to first token, and an abstract's
    sentences on other points only dilute it."""
    split = [split_sentences(p) if count_tiktoken(p) > max_tokens else None for p in passages]
    flat = [s for sentences in split if sentences for s in sentences]
    if not flat:
        return passages
    if embed is not None:
        import numpy as np

        vectors = np.asarray(embed([question, *flat]), dtype=np.float32)
        scores = iter((vectors[1:] @ vectors[0]).tolist())
    else:
        asked = set(keyword_terms(question))
        scores = iter(len(asked & set(keyword_terms(s))) for s in flat)
    out: list[str] = []
    for passage, sentences in zip(passages, split):
        if sentences is None:
            out.append(passage)
            continue
        score = [next(scores) for _ in sentences]
        out.append(
            " ".join(sentences[i] for i in evidence.best_within(sentences, score, max_tokens))
        )
    return out


def build_messages(
    question: str,
    sources: list[Source],
    budget_tokens: int,
    source_tokens: int | None = None,
    embed: Callable[[list[str]], Sequence[Sequence[float]]] | None = None,
    probe: Embed | None = None,
) -> tuple[list[dict], int]:
    """System + user messages and how many sources fit: each passage (its title, which the chunk
    repeats, dropped) trimmed to `source_tokens` with `trim_passages`, the weakest sources dropped
    first when the whole exceeds `budget_tokens`. `probe`: vectors for the injection probe."""
    passages = [sanitize(_without_title(s.passage, s.title), embed=probe).text for s in sources]
    if source_tokens:
        passages = trim_passages(question, passages, source_tokens, embed)
    blocks: list[str] = []
    used = 0
    for s, passage in zip(sources, passages):
        block = prompts.SOURCE_TEMPLATE.format(
            n=s.n, title=sanitize(s.title, title=True).text, passage=passage
        )
        cost = count_tiktoken(block)
        if blocks and used + cost > budget_tokens:
            break
        blocks.append(block)
        used += cost
    user = prompts.QUESTION_TEMPLATE.format(sources="\n\n".join(blocks), question=question)
    return (
        [
            {"role": "system", "content": prompts.SYSTEM_PROMPT},
            *prompts.EXAMPLE_TURNS,
            {"role": "user", "content": user},
        ],
        len(blocks),
    )


def _without_title(passage: str, title: str) -> str:
    return passage[len(title) :].lstrip() if title and passage.startswith(title) else passage


def answerable_probability(backend: ChatModel, messages: list[dict]) -> float:
    """The model's probability that the sources answer the question: P(yes) / (P(yes) + P(no)) for
    one token after `CHECK_PROMPT`, asked as a turn after the same prompt. A server or in-process
    llama.cpp keeps that prompt cached, so the check reads only its own few tokens and the answer
    that follows (the same prompt without the check turn) reads nothing again."""
    return backend.yes_probability(messages + [{"role": "user", "content": prompts.CHECK_PROMPT}])


def generated(
    case: Case, llm: LLMGetter, clock: ReadingClock | None = None
) -> Generator[str, None, Answer]:
    """The LLM's answer: `Reading` and `Writing` pieces while the model works, then the checked
    text, whole (nothing shown is taken back); returns the `Answer`: withdrawn (abstained) when the
    model refuses, fails the answerability check (`llm_check`), cites nothing supported
    (`llm_require_support`) or has nothing cited left once the injection filter is done; the
    extractive answer with `error` set when the LLM fails."""
    settings, sources = case.settings, case.sources
    messages, n_prompt = build_messages(
        case.question,
        sources,
        settings.llm_context_tokens,
        settings.llm_source_tokens,
        embed=case.embed,
        probe=case.probe,
    )
    clock = clock or ReadingClock()
    yield clock.reading(messages, sources[:n_prompt])
    rewriter = MarkerRewriter(n_prompt)
    # What the sources held as instructions, and the links they give: the answer may repeat neither
    # the one nor any other link (see rag/answer/injection.py).
    removed = [
        r for src in sources[:n_prompt] for r in sanitize(src.passage, embed=case.probe).removed
    ]
    allowed_urls = [src.url for src in sources if src.url]
    # The output rule (rag/answer/injection.py): codes and URLs only from content that relates to
    # the question.
    codes = allowed_codes(
        case.question,
        [(src.title, src.passage) for src in sources[:n_prompt]],
        case.embed,
        probe=case.probe,
    )
    shown: list[str] = []  # the reply, its markers renumbered
    usage = None
    try:
        backend = llm()
        answerable = None
        if "check" in case.on:
            answerable = answerable_probability(backend, messages)
            if answerable < settings.llm_check_threshold:
                yield prompts.ABSTAIN_ANSWER
                return Answer(
                    question=case.question,
                    answer=prompts.ABSTAIN_ANSWER,
                    mode="llm",
                    abstained=True,
                    abstained_by="check",
                    answerable=answerable,
                    sources=sources,
                    usage=complete_usage(None, messages, "no", backend),
                )
        written = 0
        for item in clock.timed(backend.stream(messages)):
            if isinstance(item, Usage):
                usage = item
                continue
            written += 1
            if written % WRITING_EVERY == 1:
                yield Writing(written)
            shown.append(rewriter.feed(item))
        shown.append(rewriter.close())
    except LLMError as exc:
        return (yield from llm_failed(exc, case))
    text = "".join(shown).strip()
    usage = complete_usage(usage, messages, text, backend)
    guarded = (messages[-1]["content"], allowed_urls, removed, codes)
    answer = _settled(case, rewriter, text, usage, answerable, guarded)
    yield answer.answer
    return answer


def _settled(
    case: Case,
    rewriter: MarkerRewriter,
    text: str,
    usage: Usage | None,
    answerable: float | None,
    guarded: tuple,
) -> Answer:
    """The streamed answer, checked in the table's order (rag/answer/rules/__init__.py): the model's
    refusal, the injection output rule, then the support check (`llm_require_support`)."""
    # What the stream's guard read: the prompt, the links the sources give, what they held as
    # instructions, and the codes that relate to the question.
    prompt, allowed_urls, removed, codes = guarded
    on = case.on
    if "refusal" in on and is_refusal(text):
        return not_covered(case, "llm", "model", prompts.ABSTAIN_ANSWER, answerable, usage)
    final_sources = renumber_sources(case.sources, rewriter.order)
    cleaned = (
        clean_answer(text, prompt, allowed_urls, removed, case.question, codes=codes)
        if "filter" in on
        else CleanedAnswer(text)
    )
    if cleaned.dropped:
        # Sentences and links only an injection would write: taken out, citations renumbered.
        text, final_sources, _ = renumber(cleaned.text, final_sources)
        if not text.strip() or not any(src.cited for src in final_sources):
            return withdrawn(case, "filter", cleaned.text, answerable, usage, cleaned.dropped)
    report = check_support(text, final_sources, embed=case.embed)
    final_sources = [
        src.model_copy(update={"evidence": report.evidence.get(src.n, [])}) for src in final_sources
    ]
    if "require_support" in on and not any(c.supported for c in report.citations):
        # Streamed, then checked: no claim stands on the passage it cites (or none cites one), which
        # is how a small model answers a question its sources only touch: withdrawn, the text kept
        # aside.
        return withdrawn(case, "support", text, answerable, usage)
    return answered(
        case, text, report, final_sources, usage, rewriter.invalid, answerable, cleaned.dropped
    )
