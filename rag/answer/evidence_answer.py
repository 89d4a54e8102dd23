"""The evidence-first answer (the default, `RAG_ANSWER_STYLE=evidence`): the model names the
sentences that state the answer and writes a short synthesis; the named sentences are quoted first,
as soon as the model has named them when the checks that judge quotes pass on them alone, and the
synthesis, checked sentence by sentence, follows under them. The prompt and the reading of the reply
are rag/answer/evidence.py's; this module streams, checks and settles the outcome (answered,
`not_stated`, `not_covered`).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from rag import prompts
from rag.answer import evidence
from rag.answer.citations import (
    MarkerRewriter,
    check_support,
    escape_quote,
    parse_markers,
    renumber,
    renumber_sources,
    split_sentences,
)
from rag.answer.extractive import BOILERPLATE
from rag.answer.generation import (
    WRITING_EVERY,
    ReadingClock,
    complete_usage,
    is_refusal,
    llm_failed,
)
from rag.answer.injection import sanitize
from rag.answer.outcome import answered, held_back, withdrawn
from rag.answer.question import LLMGetter, asks
from rag.answer.rules.answer_type import (
    from_another_paper,
    gives_asked_type,
    on_subject,
    unwritten_names,
)
from rag.answer.rules.first_paper import FIRST, beside_first, cites_first
from rag.answer.rules.injection_output import CleanedAnswer, allowed_codes, clean_answer
from rag.answer.rules.list_fit import fitting
from rag.answer.rules.llm_check import evidence_check
from rag.answer.rules.parts import cover
from rag.answer.rules.premise import without_premise
from rag.answer.rules.support import supported_synthesis, without_copies
from rag.config import Settings
from rag.errors import LLMError
from rag.models import AbstainedBy, Answer, Source, Usage, Writing

if TYPE_CHECKING:
    from rag.answer.case import Case
    from rag.backends.chat import ChatModel
    from rag.retrieve.search import Hit


MAX_QUOTES = 4  # sentences quoted above a synthesis (a "which papers" list quotes one per paper)


def generated_evidence(
    case: Case, llm: LLMGetter, clock: ReadingClock | None = None, absent: list[str] | None = None
) -> Generator[str, None, Answer]:
    """An evidence-first answer (rag/answer/evidence.py): `Reading` and `Writing` pieces while the
    model works, then the checked answer's text, whole; returns the `Answer`.

    The model names the sentences that state the answer and writes a short synthesis; the answer is
    those sentences quoted (for a "which papers" question, one line per paper with its sentence),
    then the synthesis, its unsupported sentences dropped. Read as a loop: the reply is read and
    parsed (`_Reply`); once the evidence line is read, the quotes are shown when the checks that
    judge quotes pass on them alone (`_early_quotes`), and the synthesis follows (`after_quotes`);
    otherwise the table's checks run in order on the whole reply (`_held`; the support rules in
    `_evidence`) and the outcome is settled: answered (`_answered`) or held back
    (rag/answer/outcome.py: `not_stated` or `not_covered`). Nothing is shown before it is checked,
    so nothing shown is taken back. A failure of the LLM gives the extractive answer with `error`
    set (after quotes were shown: those quotes, with `error`). `absent`: the question's topic terms
    none of the papers holds (the topic rule, applied by the caller): the model is not asked."""
    shown = _shown(case)
    # Every held-back answer is built by rag/answer/outcome.py, from the same sources.
    hold = partial(held_back, case, shown)
    if absent:
        # None of the papers holds the question's topic ("early-exit transformers"): a small model
        # would answer from whatever is closest, so it is not asked (docs/answers.md).
        return (yield from hold([], None, "topic", None, terms=absent))
    messages, n_prompt = evidence.build_messages(
        case.question, shown, case.settings.llm_context_tokens, case.list_question
    )
    clock = clock or ReadingClock()
    yield clock.reading(messages, case.sources[:n_prompt])
    reply = _Reply(case, messages, shown, n_prompt)
    if case.list_question and "list_fit" in case.on:  # the list holds only papers that fit
        reply.fit = fitting(
            case.embedder, case.question, case.query, case.hits, "boilerplate" in case.on
        )
    elif not case.list_question and "first_paper" in case.on:  # beside the first, papers as close
        reply.fit = beside_first(case.hits)
    try:
        backend = llm()
        yield from reply.stream(backend, clock)
    except LLMError as exc:
        if reply.early is None:
            return (yield from llm_failed(exc, case))
        reply.error = str(exc)  # the quotes shown stand; the synthesis is lost
    raw = "".join(reply.synthesis).strip()
    usage = complete_usage(reply.usage, messages, raw, backend)
    if reply.early is not None:
        return (yield from after_quotes(reply, raw, usage))
    read, kept, quotes = _evidence(reply, raw)
    answerable = _answerable(case.settings, backend, reply, quotes)
    held = _held(reply, raw, kept, quotes, answerable)
    if held is not None:
        return (yield from hold(held.quotes, answerable, held.by, usage, held.among, held.terms))
    return (yield from _answered(reply, read, kept, quotes, answerable, usage))


def _answerable(
    settings: Settings, backend: ChatModel, reply: _Reply, quotes: list[tuple[int, str]]
) -> float | None:
    """The LLM check (`llm_check`, off by default): the model's probability that the quoted
    sentences state the answer, asked after the reply, on its cached prompt (None: not asked, or the
    model failed)."""
    if not ("check" in reply.case.on and quotes and not reply.parser.none):
        return None
    try:
        return evidence_check(
            backend, reply.messages, "".join(reply.replied), [q for _, q in quotes]
        )
    except LLMError:
        return None


def _shown(case: Case) -> list[evidence.ShownSource]:
    """The sources as the model reads them: numbered sentences, the best paper's whole abstract and
    the others' closest sentences, the titles sanitized."""
    settings = case.settings
    sentences = evidence.choose_sentences(
        case.question,
        [evidence.source_sentences(h.chunk.abstract, case.probe) for h in case.hits],
        settings.llm_top_source_tokens or 10**6,
        settings.llm_source_tokens or 10**6,
        case.embed,
    )
    return [
        evidence.ShownSource(s.n, evidence.plain_prose(sanitize(s.title, title=True).text), chosen)
        for s, chosen in zip(case.sources, sentences)
    ]


class _Reply:
    """The model's reply as it streams: parsed (the sentences it names, its synthesis), its markers
    followed by the renumbering (which ones match no source); nothing the model wrote is shown
    until the checks have read it: the quotes once the evidence line is, the rest once whole."""

    def __init__(
        self, case: Case, messages: list[dict], shown: list[evidence.ShownSource], n_prompt: int
    ) -> None:
        self.case, self.messages, self.shown, self.n_prompt = case, messages, shown, n_prompt
        sources = case.sources
        self.parser = evidence.ReplyParser(n_prompt, shown)
        self.rewriter = MarkerRewriter(n_prompt)
        self.removed = [
            r for src in sources[:n_prompt] for r in sanitize(src.passage, embed=case.probe).removed
        ]
        self.allowed_urls = [src.url for src in sources if src.url]
        # The output rule (rag/answer/injection.py): codes and URLs only from content that relates
        # to the question, judged on the sentences the model read (from the whole abstract, not only
        # the retrieved chunk: a name such as "DINOv3" in a sentence of the abstract's other chunk
        # was cut from answers as "…").
        self.codes = allowed_codes(
            case.question,
            [(src.title, " ".join(s.sentences)) for src, s in zip(sources[:n_prompt], shown)],
            case.embed,
            probe=case.probe,
        )
        self.synthesis: list[str] = []  # the model's synthesis, in the prompt's numbering
        self.replied: list[str] = []  # the model's reply as it wrote it
        self.usage: Usage | None = None
        # The papers that fit the question (None: any): a list's (the list rule), or those a single
        # answer may cite beside the first paper (the first-paper rule).
        self.fit: set[int] | None = None
        self.part_quotes: list[tuple[int, str]] = []  # quoted for a part no other quote answers
        self.unstated: list[str] = []  # the parts of the question no cited sentence answers
        self.early: _Early | None = None  # the quotes shown as soon as the evidence line was read
        self.error: str | None = None  # the LLM failed after the quotes were shown

    def stream(self, backend: ChatModel, clock: ReadingClock) -> Generator[str, None, None]:
        """Read the reply, yielding `Writing` pieces as it comes, and the quotes as soon as the
        evidence line is read when they pass the checks (`_early_quotes`); stop when the model
        names no sentence."""
        reply = backend.stream(self.messages)
        judged = False  # whether the quotes were judged, once the evidence line was read
        try:
            for item in clock.timed(reply):
                if isinstance(item, Usage):
                    self.usage = item
                    continue
                self.replied.append(item)
                if len(self.replied) % WRITING_EVERY == 1:
                    yield Writing(len(self.replied))
                text = self.parser.feed(item)
                if self.parser.decided and self.parser.none and "evidence" in self.case.on:
                    break  # no sentence states the answer: what follows would be a refusal
                if self.parser.decided and not judged:
                    judged = True
                    self.early = _early_quotes(self)
                    if self.early is not None:
                        yield self.early.text  # checked: the synthesis follows when written
                self.synthesis.append(text)
                self.rewriter.feed(text)
        finally:
            close = getattr(reply, "close", None)
            if close is not None:
                close()  # stops the generation when we broke off early
        self.synthesis.append(self.parser.close())
        self.rewriter.feed(self.synthesis[-1])
        self.rewriter.close()


def _evidence(reply: _Reply, raw: str) -> tuple[list[Source], str, list[tuple[int, str]]]:
    """The sources as read, the synthesis the support rules keep and the sentences quoted.

    The synthesis as it stands in the prompt's numbering, each sentence checked against the
    sentences the model read of the source it cites; unsupported ones are dropped (the quotes stay).
    Only what is kept steers which sentences are quoted."""
    shown, parser, case = reply.shown, reply.parser, reply.case
    question, list_question, embed = case.question, case.list_question, case.embed
    read = _read(reply)
    on = case.on
    kept = supported_synthesis(raw, read, [n for n, _ in parser.evidence], embed, question, on)
    settled = evidence.settle_evidence(
        parser.evidence, shown, kept, question, list_question, embed, MAX_QUOTES
    )
    if not settled and raw and not parser.none and not is_refusal(raw):
        # The model answered without naming sentences, and its own words did not hold up: quote,
        # from the sources it cited, the sentences its claims meant.
        settled = evidence.settle_evidence([], shown, raw, question, list_question, embed)
    quotes = [(n, shown[n - 1].sentences[i - 1]) for n, i in settled]
    quotes = [(n, q) for n, q in quotes if not ("boilerplate" in on and BOILERPLATE.search(q))]
    claims = split_sentences(kept)
    cited = [n for n, _ in quotes] + [n for claim in claims for n in parse_markers(claim)]
    # The list rule, and the first-paper rule for a single answer citing the first paper: no line,
    # and no claim, for a paper that does not fit (one citing none of it is held back, `_held`).
    if reply.fit is not None and (list_question or cites_first(cited)):
        quotes = [(n, q) for n, q in quotes if n in reply.fit]
        fitting_claims = [s for s in claims if set(parse_markers(s)) <= reply.fit]
        kept = kept if len(fitting_claims) == len(claims) else " ".join(fitting_claims)
    if not list_question and "premise" in on:  # the paper's own sentences, not its premise
        quotes = without_premise(quotes, case.hits, [s.sentences for s in shown], question, embed)
    if not list_question and "parts" in on:
        quotes = _cover_parts(reply, kept, quotes)
    if "quote_repeats" in on:
        kept = without_copies(kept, [q for _, q in quotes])
    return read, kept, quotes


def _cover_parts(reply: _Reply, kept: str, quotes: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The parts rule (rag/answer/rules/parts.py): `quotes` with, for each part of a two-part
    question no quote answers, the cited papers' sentence that does; the parts none answers are
    kept on `reply.unstated`, to be named in the answer."""
    parts = asks(reply.case.question)
    claims = split_sentences(kept)
    cited = {n for n, _ in quotes} | {n for claim in claims for n in parse_markers(claim)}
    shown = {n: reply.shown[n - 1].sentences for n in cited if 0 < n <= len(reply.shown)}
    abstracts = [" ".join(sentences) for sentences in shown.values()]
    reply.part_quotes, reply.unstated = cover(parts, quotes, shown, abstracts, reply.case.embed)
    return quotes[:MAX_QUOTES] + reply.part_quotes if reply.part_quotes else quotes


@dataclass
class _Early:
    """The quotes shown before the synthesis: their text as shown (the final numbering), the quotes
    (the prompt's numbering) and the renumbering, which what follows them continues."""

    text: str
    quotes: list[tuple[int, str]]
    rewriter: MarkerRewriter


def _early_quotes(reply: _Reply) -> _Early | None:
    """The sentences the model named, quoted as soon as its evidence line is read, when the checks
    that judge an answer's quotes (`_held`, the injection output rule) pass on them alone; the
    parts rule adds a quote for a part they leave open. None: the answer waits for the whole
    reply (no sentence named, a check would hold the answer back, or the LLM check is on)."""
    parser, case, shown = reply.parser, reply.case, reply.shown
    on = case.on
    if "check" in on or not parser.evidence:
        return None

    def usable(picks: list[tuple[int, int]]) -> list[tuple[int, str]]:
        return [
            (n, q)
            for n, q in ((n, shown[n - 1].sentences[i - 1]) for n, i in picks)
            if not ("boilerplate" in on and BOILERPLATE.search(q))
            and (reply.fit is None or n in reply.fit)
        ]

    settled = evidence.settle_evidence(
        parser.evidence, shown, "", case.question, case.list_question, case.embed, MAX_QUOTES
    )
    quotes, named = usable(settled), usable(parser.evidence)
    # The checks judge the sentences the model named: a neighbour quoted beside one (it may be
    # what the model meant) is no sign that the answer is stated.
    if not (quotes and named) or _held(reply, "", "", named, None) is not None:
        return None
    if not case.list_question and "premise" in on:
        sentences = [s.sentences for s in shown]
        quotes = without_premise(quotes, case.hits, sentences, case.question, case.embed)
    if not case.list_question and "parts" in on:
        quotes = _cover_parts(reply, "", quotes)
    block = _quote_block(quotes, shown, case.list_question, MAX_QUOTES + len(reply.part_quotes))
    if "filter" in on and _cleaned(reply, block).dropped:
        return None  # the whole reply decides what the injection rule leaves
    rewriter = MarkerRewriter(len(case.sources))
    return _Early(rewriter.feed(block), quotes, rewriter)


def after_quotes(reply: _Reply, raw: str, usage: Usage | None) -> Generator[str, None, Answer]:
    """The answer whose quotes were shown (`_early_quotes`): the synthesis under them, its
    sentences kept by the support rules and citing only papers quoted (`quoted_papers`), then the
    parts no cited sentence states. The checks that judged the quotes are not asked again: what is
    shown stands."""
    case, early = reply.case, reply.early
    assert early is not None
    on = case.on
    read = _read(reply)
    picked = [n for n, _ in reply.parser.evidence]
    kept = supported_synthesis(raw, read, picked, case.embed, case.question, on)
    allowed = {n for n, _ in early.quotes} if "quoted_papers" in on else reply.fit
    if allowed is not None:
        kept = " ".join(c for c in split_sentences(kept) if set(parse_markers(c)) <= allowed)
    if "quote_repeats" in on:
        kept = without_copies(kept, [q for _, q in early.quotes])
    dropped: list[str] = []
    if kept and "filter" in on:
        cleaned = _cleaned(reply, kept)
        kept, dropped = cleaned.text, cleaned.dropped
    rest = (early.rewriter.feed("\n\n" + kept) if kept.strip() else "") + early.rewriter.close()
    rest = rest.rstrip() + "".join(
        f"\n\n{prompts.UNSTATED_PART.format(part=p)}" for p in reply.unstated
    )
    if rest:
        yield rest
    text, sources = early.text + rest, case.sources
    final_sources = renumber_sources(read + sources[reply.n_prompt :], early.rewriter.order)
    report = check_support(text, final_sources, embed=case.embed)
    final_sources = _cited_evidence(
        case.hits, sources, final_sources, read, early.quotes, report.evidence
    )
    removed = reply.rewriter.invalid + early.rewriter.invalid
    answer = answered(case, text, report, final_sources, usage, removed, None, dropped)
    return answer.model_copy(update={"error": reply.error}) if reply.error else answer


def _cleaned(reply: _Reply, text: str) -> CleanedAnswer:
    """`text` under the injection output rule (rag/answer/rules/injection_output.py)."""
    case = reply.case
    return clean_answer(
        text,
        reply.messages[-1]["content"],
        reply.allowed_urls,
        reply.removed,
        case.question,
        codes=reply.codes,
    )


def _read(reply: _Reply) -> list[Source]:
    """The sources as the model read them: each passage is the sentences shown."""
    return [
        src.model_copy(update={"passage": " ".join(s.sentences)})
        for src, s in zip(reply.case.sources[: reply.n_prompt], reply.shown)
    ]


@dataclass
class _Held:
    """Which rule held the answer back, and what the held-back answer quotes and names."""

    by: AbstainedBy
    quotes: list[tuple[int, str]]
    among: list[int] | None = None
    terms: list[str] | None = None


def _held(
    reply: _Reply,
    raw: str,
    kept: str,
    quotes: list[tuple[int, str]],
    answerable: float | None,
) -> _Held | None:
    """The table's checks on the model's answer, in order (rag/answer/rules/__init__.py): the LLM
    check, the asked answer type, another paper's subject, unwritten names, then the model's own
    evidence. The first that holds the answer back decides; None: none did."""
    parser, case, shown = reply.parser, reply.case, reply.shown
    on = case.on
    question, hits = case.question, case.hits
    if answerable is not None and answerable < case.settings.llm_check_threshold:
        return _Held("check", quotes)
    # The answer-type rules judge an answer: quotes, from a reply that neither named no sentence nor
    # refused.
    judged = bool(quotes) and not parser.none and not (raw and is_refusal(raw))
    # The abstracts the model read from: where they define the question's own subject ("the neural
    # concept verifier" is NCV), that name is no answer to it.
    abstracts = [h.chunk.abstract for h in hits[: len(shown)]]
    said = kept + "\n" + "\n".join(q for _, q in quotes)
    if "answer_type" in on and judged and not gives_asked_type(question, said, abstracts):
        # A number question answered without a number, a "which benchmarks" question without a
        # name: the sentences are on the subject but do not state what was asked.
        return _Held("answer_type", quotes)
    keyword_scores = {n: h.keyword for n, h in enumerate(hits[: len(shown)], start=1)}
    pieces = [
        (n, sentence) for sentence in split_sentences(kept) for n in set(parse_markers(sentence))
    ] + quotes
    if (
        "answer_source" in on
        and judged
        and from_another_paper(question, pieces, keyword_scores, abstracts)
    ):
        # The number or names asked for come from a paper other than the one asked about: not
        # stated, quoting what the papers about the question's subject say.
        about = on_subject(keyword_scores)
        return _Held("answer_source", [(n, q) for n, q in quotes if n in about], among=about)
    if "answer_names" in on and judged and not case.list_question:
        # The question names something none of the papers the answer cites mentions ("ResNet-50"
        # answered with a DeiT's accuracy): the answer is about other work, or the paper does not
        # state that detail.
        cited = dict.fromkeys(n for n, _ in pieces)
        texts = [hits[n - 1].title_and_abstract for n in cited if 0 < n <= len(abstracts)]
        unwritten = unwritten_names(question, texts)
        if unwritten:
            return _Held("answer_names", quotes, terms=unwritten)
    if (
        "first_paper" in on
        and judged
        and not case.list_question
        and not cites_first(n for n, _ in pieces)
    ):
        # Answered only from papers retrieval ranked below the first: not stated, quoting the
        # first paper, the one that fits the question best.
        return _Held("first_paper", [], among=[FIRST])
    if "evidence" in on and (parser.none or (raw and is_refusal(raw)) or not (raw or quotes)):
        return _Held("evidence", quotes)
    return None


def _answered(
    reply: _Reply,
    read: list[Source],
    kept: str,
    quotes: list[tuple[int, str]],
    answerable: float | None,
    usage: Usage | None,
) -> Generator[str, None, Answer]:
    """The answer that passed the checks: the quote block, the synthesis kept under it; then the
    injection output rule and the support check on the whole, and its text shown."""
    case = reply.case
    cap = MAX_QUOTES + len(reply.part_quotes)
    block = _quote_block(quotes, reply.shown, case.list_question, cap)
    text = (block + "\n\n" + kept).strip() if block else kept
    if not text:
        return (yield from held_back(case, reply.shown, quotes, answerable, "support", usage))
    cleaned = _cleaned(reply, text) if "filter" in case.on else CleanedAnswer(text)
    sources = case.sources
    text, final_sources, invalid = renumber(cleaned.text, read + sources[reply.n_prompt :])
    if not text.strip() or not any(src.cited for src in final_sources):
        answer = withdrawn(case, "filter", cleaned.text, answerable, usage, cleaned.dropped)
    else:
        report = check_support(text, final_sources, embed=case.embed)
        final_sources = _cited_evidence(
            case.hits, sources, final_sources, read, quotes, report.evidence
        )
        removed = reply.rewriter.invalid + invalid
        # The parts of the question no cited sentence answers, said after the quotes.
        text += "".join(f"\n\n{prompts.UNSTATED_PART.format(part=p)}" for p in reply.unstated)
        answer = answered(
            case, text, report, final_sources, usage, removed, answerable, cleaned.dropped
        )
    yield answer.answer
    return answer


def _cited_evidence(
    hits: list[Hit],
    sources: list[Source],
    final_sources: list[Source],
    read: list[Source],
    quotes: list[tuple[int, str]],
    closest: dict[int, list[str]],
) -> list[Source]:
    """Shown with each cited source: the sentences quoted from it (else those `closest` to the
    claims citing it), in the retrieved passage, or in the whole abstract when a quote comes from
    another chunk."""
    by_id = {h.paper.paper_id: (src.passage, h.chunk.abstract) for h, src in zip(hits, sources)}
    return [
        _with_evidence(
            src,
            [q for n, q in quotes if read[n - 1].paper_id == src.paper_id]
            or closest.get(src.n, []),
            *by_id[src.paper_id],
        )
        for src in final_sources
    ]


def _with_evidence(source: Source, sentences: list[str], passage: str, abstract: str) -> Source:
    inside = all(" ".join(q.split()) in " ".join(passage.split()) for q in sentences)
    return source.model_copy(
        update={"evidence": sentences, "passage": passage if inside else abstract}
    )


def _quote_block(
    quotes: list[tuple[int, str]],
    shown: list[evidence.ShownSource],
    list_question: bool,
    cap: int = MAX_QUOTES,
) -> str:
    """The evidence sentences as lines, each with its [n] (the prompt's numbering): up to `cap` of
    them; for a "which papers" question, one line per paper, its title first."""
    if list_question:
        first: dict[int, str] = {}
        for n, q in quotes:
            first.setdefault(n, q)
        return "\n".join(
            f"- {escape_quote(shown[n - 1].title)}: {escape_quote(q)} [{n}]"
            for n, q in first.items()
        )
    return "\n".join(f"- {escape_quote(q)} [{n}]" for n, q in quotes[:cap])
