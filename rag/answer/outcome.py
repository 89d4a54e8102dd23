"""Every held-back answer, extractive or the model's, is built here: `not_stated` (the papers are on
the subject: the lead says the answer is not stated, or names the terms none of them holds, and the
closest sentences are quoted, cited) or `not_covered` (the refusal, or the refusal naming the terms,
with the retrieved sources, none cited). The rule that held it back is its `abstained_by`
(rag/answer/rules/__init__.py)."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

from rag import prompts
from rag.answer.citations import SupportReport, escape_quote, renumber
from rag.answer.evidence import ShownSource
from rag.answer.extractive import BOILERPLATE
from rag.answer.rules.topic import named
from rag.models import AbstainedBy, Answer, Citation, Source, Usage

if TYPE_CHECKING:
    from rag.answer.case import Case


def wording(by: AbstainedBy, terms: list[str]) -> tuple[str, str]:
    """The lead of a `not_stated` answer and the refusal of a `not_covered` one: naming the `terms`
    none of the papers holds (the topic rule) or none of the cited papers writes (the names rule),
    else the plain ones."""
    if by == "topic" and terms:
        return (
            prompts.ABSENT_TOPIC_LEAD.format(terms=named(terms)),
            prompts.ABSENT_TOPIC_ANSWER.format(terms=named(terms)),
        )
    if by == "answer_names" and terms:
        return (
            prompts.UNWRITTEN_NAMES_LEAD.format(terms=named(terms)),
            prompts.UNWRITTEN_NAMES_ANSWER.format(terms=named(terms)),
        )
    return prompts.NOT_STATED_LEAD, prompts.ABSTAIN_ANSWER


def answered(
    case: Case,
    text: str,
    report: SupportReport,
    sources: list[Source],
    usage: Usage | None,
    removed_markers: list[int],
    answerable: float | None,
    dropped: list[str],
) -> Answer:
    """The model's answer as it stands after the checks, with what the support check found."""
    return Answer(
        question=case.question,
        answer=text,
        mode="llm",
        citations=report.citations,
        sources=sources,
        grounding=report.grounding,
        usage=usage,
        uncited_sentences=report.uncited,
        removed_markers=removed_markers,
        answerable=answerable,
        filtered=dropped,
    )


def withdrawn(
    case: Case,
    by: AbstainedBy,
    text: str,
    answerable: float | None,
    usage: Usage | None,
    dropped: list[str] | None = None,
) -> Answer:
    """The model's reply taken back by a check after the model wrote it: the refusal, with the reply
    kept aside in `withdrawn` (and what the injection rule dropped from it in `filtered`)."""
    return Answer(
        question=case.question,
        answer=prompts.ABSTAIN_ANSWER,
        mode="llm",
        abstained=True,
        abstained_by=by,
        answerable=answerable,
        sources=case.sources,
        usage=usage,
        withdrawn=text,
        filtered=dropped or [],
    )


def not_covered(
    case: Case,
    mode: Literal["llm", "extractive"],
    by: AbstainedBy,
    refusal: str,
    answerable: float | None = None,
    usage: Usage | None = None,
) -> Answer:
    """The refusal, with the retrieved sources (none cited)."""
    return Answer(
        question=case.question,
        answer=refusal,
        mode=mode,
        outcome="not_covered",
        abstained_by=by,
        answerable=answerable,
        sources=case.sources,
        usage=usage,
    )


def held_back_quotes(
    case: Case,
    answer: Answer,
    by: Literal["topic", "answer_names"],
    terms: list[str],
    on_subject: bool,
) -> Answer:
    """An extractive answer held back by the topic rule (a term none of the papers holds) or the
    names rule (a name none of the quoted papers writes): the lead naming the `terms` first, the
    quotes kept as the closest the papers come, when they are on the subject (`not_stated`), else
    the refusal naming them (`not_covered`)."""
    lead, refusal = wording(by, terms)
    if not on_subject:
        return not_covered(case, "extractive", by, refusal)
    quotes = attributed(answer.answer.partition("\n")[2], answer.sources)
    return answer.model_copy(
        update={
            "answer": f"{lead}\n{quotes}",
            "outcome": "not_stated",
            "abstained": True,
            "abstained_by": by,
        }
    )


def held_back(
    case: Case,
    shown: list[ShownSource],
    quotes: list[tuple[int, str]],
    answerable: float | None,
    by: AbstainedBy,
    usage: Usage | None,
    among: list[int] | None = None,
    terms: list[str] | None = None,
) -> Generator[str, None, Answer]:
    """The model's answer held back by the rule `by`: `not_stated` with the closest sentences quoted
    when the papers are on the subject (a name of the question in a retrieved paper, or the best
    dense similarity at least `not_stated_threshold`), else `not_covered`. Without `quotes`, the
    sentence closest to the question among the sources numbered `among` (default: the first two) is
    quoted. `terms`: what the topic rule or the names rule found missing, named in the answer."""
    lead, refusal = wording(by, terms or [])
    if not case.on_subject() or not shown or not any(s.sentences for s in shown):
        yield refusal
        return not_covered(case, "llm", by, refusal, answerable, usage)
    sources = case.sources
    if not quotes:
        quotes = _closest(case, shown, among or [1, 2])
    lines = attributed("\n".join(f"- {escape_quote(q)} [{n}]" for n, q in quotes[:2]), sources)
    text, final_sources, _ = renumber(f"{lead}\n{lines}", sources)
    yield text
    quoted = {sources[n - 1].paper_id: [q for m, q in quotes[:2] if m == n] for n, _ in quotes[:2]}
    final_sources = [
        s.model_copy(update={"evidence": quoted.get(s.paper_id, [])}) for s in final_sources
    ]
    citations = [
        Citation(n=s.n, paper_id=s.paper_id, supported=True) for s in final_sources if s.cited
    ]
    return Answer(
        question=case.question,
        answer=text,
        mode="llm",
        outcome="not_stated",
        abstained_by=by,
        citations=citations,
        sources=final_sources,
        grounding=1.0,
        answerable=answerable,
        usage=usage,
    )


def attributed(lines: str, sources: list[Source]) -> str:
    """The quote lines ("- sentence [n]") of a held-back answer, naming their paper where it changes
    ("- In “Title”: sentence [n]"): the closest sentence may be another paper's, and a quick reader
    takes a number in it for the answer to the question. A line that names its paper already (a
    list's) stays as it is."""
    out, previous = [], ""
    for line in lines.splitlines():
        body, _, n = line[2:-1].rpartition(" [") if line.startswith("- ") else ("", "", "")
        if line.endswith("]") and n.isdigit() and 1 <= int(n) <= len(sources):
            title = escape_quote(sources[int(n) - 1].title)
            if n != previous and not body.startswith(f"{title}: "):
                line = f"- In “{title}”: {body} [{n}]"
            previous = n
        out.append(line)
    return "\n".join(out)


def _closest(case: Case, shown: list[ShownSource], among: list[int]) -> list[tuple[int, str]]:
    """The sentence closest to the question among the sources numbered `among` (none when they
    show only boilerplate)."""
    import numpy as np

    boilerplate = "boilerplate" in case.on
    candidates = [
        (s.n, t)
        for s in shown
        if s.n in among
        for t in s.sentences
        if not (boilerplate and BOILERPLATE.search(t))
    ]
    if not candidates:
        return []
    vectors = np.asarray(case.embed([case.question, *(t for _, t in candidates)]), dtype=np.float32)
    return [candidates[int(np.argmax(vectors[1:] @ vectors[0]))]]
