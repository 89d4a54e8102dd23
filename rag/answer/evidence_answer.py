"""The evidence-first answer (the default, `RAG_ANSWER_STYLE=evidence`): the model names the
sentences that state the answer and writes a short synthesis; the synthesis is checked sentence by
sentence and the named sentences are quoted under it. The prompt and the reading of the reply are
rag/answer/evidence.py's; this module streams, checks and settles the outcome (answered,
`not_stated`, `not_covered`).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Literal

from rag import prompts
from rag.answer import evidence
from rag.answer.answer_type import from_another_paper, gives_asked_type, on_subject, unwritten_names
from rag.answer.citations import (
    MARKER,
    MarkerRewriter,
    check_support,
    escape_quote,
    is_claim,
    parse_markers,
    renumber,
    split_sentences,
)
from rag.answer.extractive import BOILERPLATE
from rag.answer.generation import (
    ReadingClock,
    complete_usage,
    is_refusal,
    llm_failed,
    on_the_subject,
)
from rag.answer.injection import StreamGuard, allowed_codes, clean_answer, sanitize
from rag.answer.question import LLMGetter
from rag.answer.topic_terms import named
from rag.config import Settings
from rag.errors import LLMError
from rag.models import Answer, Citation, Source, Usage
from rag.text import keyword_terms

if TYPE_CHECKING:
    from rag.backends.chat import ChatModel
    from rag.backends.embedders import Embedder
    from rag.retrieve.search import Hit


MAX_QUOTES = 4  # sentences quoted under a synthesis (a "which papers" list quotes one per paper)


def generated_evidence(
    settings: Settings,
    embedder: Embedder,
    llm: LLMGetter,
    question: str,
    query: str,
    hits: list[Hit],
    sources: list[Source],
    clock: ReadingClock | None = None,
    absent: list[str] | None = None,
) -> Generator[str, None, Answer]:
    """Stream an evidence-first answer (rag/answer/evidence.py) and return the checked `Answer`.

    The model names the sentences that state the answer and writes a short synthesis; the answer is
    the synthesis (its unsupported sentences dropped) followed by those sentences quoted, or, for a
    "which papers" question, one line per paper with its sentence. When the model names no sentence,
    the outcome is `not_stated` (the papers are on the subject: their closest sentence is quoted) or
    `not_covered`. A failure of the LLM gives the extractive answer with `error` set. `absent`: the
    question's topic terms none of the papers holds (rag/answer/topic_terms.py, found by the
    caller): the model is not asked."""

    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        return embedder.embed(texts, truncate=True)

    list_question = evidence.is_list_question(question)
    sentences = evidence.choose_sentences(
        question,
        [evidence.source_sentences(h.chunk.abstract) for h in hits],
        settings.llm_top_source_tokens or 10**6,
        settings.llm_source_tokens or 10**6,
        embed,
    )
    shown = [
        evidence.ShownSource(s.n, evidence.plain_prose(sanitize(s.title, title=True).text), chosen)
        for s, chosen in zip(sources, sentences)
    ]
    if absent:
        # None of the papers holds the question's topic ("early-exit transformers"): a small model
        # would answer from whatever is closest, so it is not asked (docs/answers.md).
        return (
            yield from _unanswered(
                settings,
                embed,
                question,
                hits,
                sources,
                shown,
                [],
                None,
                "topic",
                None,
                absent=absent,
            )
        )
    messages, n_prompt = evidence.build_messages(
        question, shown, settings.llm_context_tokens, list_question
    )
    clock = clock or ReadingClock()
    yield clock.reading(messages, n_prompt)
    parser = evidence.ReplyParser(n_prompt, shown)
    rewriter = MarkerRewriter(n_prompt)
    removed = [r for src in sources[:n_prompt] for r in sanitize(src.passage).removed]
    allowed_urls = [src.url for src in sources if src.url]
    # The output rule (rag/answer/injection.py): codes and URLs only from content that relates to
    # the question, judged on the sentences the model read (from the whole abstract, not only the
    # retrieved chunk: a name such as "DINOv3" in a sentence of the abstract's other chunk was cut
    # from answers as "…").
    codes = allowed_codes(
        question,
        [(src.title, " ".join(s.sentences)) for src, s in zip(sources[:n_prompt], shown)],
        embed,
    )
    guard = StreamGuard(messages[-1]["content"], allowed_urls, removed, question, codes=codes)
    synthesis: list[str] = []  # the model's synthesis, in the prompt's numbering
    replied: list[str] = []  # the model's reply as it wrote it
    usage = None
    answerable = None

    started = False

    def show(text: str) -> str:
        nonlocal started
        if not started:
            text = text.lstrip()
            started = bool(text)
        return guard.feed(rewriter.feed(text)) if text else ""

    try:
        backend = llm()
        reply = backend.stream(messages)
        try:
            timed = clock.timed(reply)
            for item in timed:
                if isinstance(item, Usage):
                    usage = item
                    continue
                replied.append(item)
                text = parser.feed(item)
                if parser.decided and parser.none:
                    break  # no sentence states the answer: what follows would be a refusal
                synthesis.append(text)
                live = show(text)
                if live:
                    yield live
        finally:
            close = getattr(reply, "close", None)
            if close is not None:
                close()  # stops the generation when we broke off early
        synthesis.append(parser.close())
    except LLMError as exc:
        return (yield from llm_failed(exc, started, embedder, question, query, hits, sources))
    raw = "".join(synthesis).strip()
    usage = complete_usage(usage, messages, raw, backend)
    # The synthesis as it stands in the prompt's numbering, each sentence checked against the
    # sentences the model read of the source it cites; unsupported ones are dropped (the quotes
    # stay). Only what is kept steers which sentences are quoted.
    read = [
        src.model_copy(update={"passage": " ".join(s.sentences)})
        for src, s in zip(sources[:n_prompt], shown)
    ]
    kept = _supported_synthesis(raw, read, [n for n, _ in parser.evidence], embed, question)
    settled = evidence.settle_evidence(parser.evidence, shown, kept, question, list_question, embed)
    if not settled and raw and not parser.none and not is_refusal(raw):
        # The model answered without naming sentences, and its own words did not hold up: quote,
        # from the sources it cited, the sentences its claims meant.
        settled = evidence.settle_evidence([], shown, raw, question, list_question, embed)
    quotes = [(n, shown[n - 1].sentences[i - 1]) for n, i in settled]
    quotes = [(n, q) for n, q in quotes if not BOILERPLATE.search(q)]
    kept = _without_copies(kept, [q for _, q in quotes])
    if settings.llm_check and quotes and not parser.none:
        # The narrow check: do the quoted sentences state the answer? Asked after the reply, on its
        # cached prompt.
        try:
            answerable = evidence_check(backend, messages, "".join(replied), [q for _, q in quotes])
        except LLMError:
            answerable = None
        if answerable is not None and answerable < settings.llm_check_threshold:
            tail = guard.feed(rewriter.close()) + guard.close()
            if tail.strip():
                yield tail
            return (
                yield from _unanswered(
                    settings,
                    embed,
                    question,
                    hits,
                    sources,
                    shown,
                    quotes,
                    answerable,
                    "check",
                    usage,
                    streamed=started,
                )
            )
    # The abstracts the model read from: where they define the question's own subject ("the neural
    # concept verifier" is NCV), that name is no answer to it.
    abstracts = [h.chunk.abstract for h in hits[: len(shown)]]
    if (
        settings.answer_type_check
        and quotes
        and not parser.none
        and not (raw and is_refusal(raw))
        and not gives_asked_type(question, kept + "\n" + "\n".join(q for _, q in quotes), abstracts)
    ):
        # A number question answered without a number, a "which benchmarks" question without a name:
        # the sentences are on the subject but do not state what was asked
        # (rag/answer/answer_type.py).
        tail = guard.feed(rewriter.close()) + guard.close()
        if tail.strip():
            yield tail
        return (
            yield from _unanswered(
                settings,
                embed,
                question,
                hits,
                sources,
                shown,
                quotes,
                answerable,
                "answer_type",
                usage,
                streamed=started,
            )
        )
    keyword_scores = {n: h.keyword for n, h in enumerate(hits[: len(shown)], start=1)}
    pieces = [
        (n, sentence) for sentence in split_sentences(kept) for n in set(parse_markers(sentence))
    ] + quotes
    if (
        settings.answer_type_check
        and quotes
        and not parser.none
        and not (raw and is_refusal(raw))
        and from_another_paper(question, pieces, keyword_scores, abstracts)
    ):
        # The number or names asked for come from a paper other than the one asked about (another
        # paper's figure): not stated, quoting what the papers about the question's subject say.
        tail = guard.feed(rewriter.close()) + guard.close()
        if tail.strip():
            yield tail
        about = on_subject(keyword_scores)
        return (
            yield from _unanswered(
                settings,
                embed,
                question,
                hits,
                sources,
                shown,
                [(n, q) for n, q in quotes if n in about],
                answerable,
                "answer_source",
                usage,
                streamed=started,
                among=about,
            )
        )
    unwritten = (
        unwritten_names(
            question,
            [
                hits[n - 1].title_and_abstract
                for n in dict.fromkeys(n for n, _ in pieces)
                if 0 < n <= len(abstracts)
            ],
        )
        if settings.answer_type_check
        and quotes
        and not parser.none
        and not list_question
        and not (raw and is_refusal(raw))
        else []
    )
    if unwritten:
        # The question names something none of the papers the answer cites mentions ("ResNet-50"
        # answered with a DeiT's accuracy): the answer is about other work, or the paper does not
        # state that detail.
        tail = guard.feed(rewriter.close()) + guard.close()
        if tail.strip():
            yield tail
        return (
            yield from _unanswered(
                settings,
                embed,
                question,
                hits,
                sources,
                shown,
                quotes,
                answerable,
                "answer_names",
                usage,
                streamed=started,
                unwritten=unwritten,
            )
        )
    if parser.none or (raw and is_refusal(raw)) or not (raw or quotes):
        tail = guard.feed(rewriter.close()) + guard.close()
        if tail.strip():
            yield tail
        return (
            yield from _unanswered(
                settings,
                embed,
                question,
                hits,
                sources,
                shown,
                quotes,
                answerable,
                "evidence",
                usage,
                streamed=bool("".join(synthesis).strip()),
            )
        )
    block = _quote_block(quotes, shown, list_question)
    tail = rewriter.feed("\n\n" + block) if block else ""
    live = guard.feed(tail + rewriter.close()) + guard.close()
    if live:
        yield live
    text = (kept + "\n\n" + block).strip() if block else kept
    if not text:
        return (
            yield from _unanswered(
                settings,
                embed,
                question,
                hits,
                sources,
                shown,
                quotes,
                answerable,
                "support",
                usage,
                streamed=True,
            )
        )
    cleaned = clean_answer(
        text, messages[-1]["content"], allowed_urls, removed, question, codes=codes
    )
    text, final_sources, invalid = renumber(cleaned.text, read + sources[n_prompt:])
    if not text.strip() or not any(src.cited for src in final_sources):
        return Answer(
            question=question,
            answer=prompts.ABSTAIN_ANSWER,
            mode="llm",
            abstained=True,
            abstained_by="filter",
            answerable=answerable,
            sources=sources,
            usage=usage,
            withdrawn=cleaned.text,
            filtered=cleaned.dropped,
        )
    report = check_support(text, final_sources, embed=embed)
    # Shown with each cited source: the sentences quoted from it (else those closest to the claims
    # citing it), in the retrieved passage, or in the whole abstract when a quote comes from another
    # chunk.
    by_id = {h.paper.paper_id: (src.passage, h.chunk.abstract) for h, src in zip(hits, sources)}
    final_sources = [
        _with_evidence(
            src,
            [q for n, q in quotes if read[n - 1].paper_id == src.paper_id]
            or report.evidence.get(src.n, []),
            *by_id[src.paper_id],
        )
        for src in final_sources
    ]
    return Answer(
        question=question,
        answer=text,
        mode="llm",
        citations=report.citations,
        sources=final_sources,
        grounding=report.grounding,
        usage=usage,
        uncited_sentences=report.uncited,
        removed_markers=rewriter.invalid + invalid,
        answerable=answerable,
        filtered=cleaned.dropped,
    )


def evidence_check(
    backend: ChatModel, messages: list[dict], reply: str, sentences: list[str]
) -> float:
    """The model's probability that the `sentences` it named state the answer, not only its subject:
    P(yes) of one token, asked as a turn after its own reply. The conversation so far is what
    llama.cpp holds in its cache, so the check reads a few dozen tokens; a prompt of its own would
    evict the cached system prompt and cost the next question seconds."""
    listed = "\n".join(f"- {s}" for s in sentences)
    return backend.yes_probability(
        [
            *messages,
            {"role": "assistant", "content": reply or "EVIDENCE: NONE"},
            {"role": "user", "content": prompts.EVIDENCE_CHECK_PROMPT.format(sentences=listed)},
        ]
    )


def _without_copies(synthesis: str, quotes: list[str]) -> str:
    """The synthesis without its sentences that only repeat a quoted sentence (the quote says it,
    exactly)."""
    if not synthesis or not quotes:
        return synthesis
    quoted = [set(keyword_terms(q)) for q in quotes]
    kept = []
    for sentence in split_sentences(synthesis):
        words = set(keyword_terms(sentence))
        if words and any(
            len(words & q) >= 0.8 * len(words) and len(words & q) >= 0.8 * len(q) for q in quoted
        ):
            continue
        kept.append(sentence)
    return synthesis if len(kept) == len(split_sentences(synthesis)) else " ".join(kept)


def _with_evidence(source: Source, sentences: list[str], passage: str, abstract: str) -> Source:
    inside = all(" ".join(q.split()) in " ".join(passage.split()) for q in sentences)
    return source.model_copy(
        update={"evidence": sentences, "passage": passage if inside else abstract}
    )


def grafted_words(sentence: str, cited: str, question: str) -> list[str]:
    """Words of a synthesis sentence that its cited text lacks and the question holds: a small model
    asked "how do knowledge graph embeddings do link prediction?" writes "Knowledge graph embedding
    methods do link prediction by <what an unrelated abstract says>". Two or more mark the sentence
    unsupported (measured on the audited sentences of docs/answers.md: 3 of 8 unsupported caught, 0
    of 42 supported)."""
    source = set(keyword_terms(cited))
    asked = set(keyword_terms(question))
    return [
        w
        for w in dict.fromkeys(keyword_terms(sentence))
        if len(w) >= 4 and w in asked and w not in source
    ]


_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9+\-.]*[A-Za-z0-9+]|[A-Za-z0-9]")
_COPY_RUN = 4  # words copied around a swapped name: the sentence is the source's, a name changed


def swapped_names(sentence: str, cited: str) -> list[tuple[str, str]]:
    """(written, source's) names where a synthesis sentence copies a sentence of its cited text but
    for a name: "Palimpsa is a special case of Palimpsa where forgetting dominates" from "... Mamba2
    is a special case of Palimpsa where forgetting dominates" (the README's example). Every word of
    it is in the source, so the support check passed it. A name is a capitalized word that the
    source capitalizes after a sentence's first word or that has a capital inside, or a word with a
    digit ("GPT-4"); the swap counts when at most two words replace at most three next to a run of
    `_COPY_RUN` or more copied words."""
    import difflib

    written = _TOKEN.findall(MARKER.sub(" ", sentence))
    names = {
        w.lower()
        for s in split_sentences(cited)
        for w in _TOKEN.findall(s)[1:]
        if w[0].isupper() and len(w) > 1
    }

    def is_name(word: str) -> bool:
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word):
            return True
        return word[0].isupper() and (word.lower() in names or word[1:].lower() != word[1:])

    swaps = []
    for source in split_sentences(cited):
        tokens = _TOKEN.findall(source)
        ops = difflib.SequenceMatcher(
            None, [w.lower() for w in written], [w.lower() for w in tokens], autojunk=False
        ).get_opcodes()
        for k, (tag, i1, i2, j1, j2) in enumerate(ops):
            if tag != "replace" or i2 - i1 > 2:
                continue
            after = (
                k + 1 < len(ops)
                and ops[k + 1][0] == "equal"
                and ops[k + 1][2] - ops[k + 1][1] >= _COPY_RUN
            )
            before = (
                k > 0 and ops[k - 1][0] == "equal" and ops[k - 1][2] - ops[k - 1][1] >= _COPY_RUN
            )
            if not (after or before):
                continue
            # The source's words beside the copied run: what the written words stand in for.
            replaced = tokens[max(j1, j2 - 3) : j2] if after else tokens[j1 : min(j2, j1 + 3)]
            ours = [w for w in written[i1:i2] if is_name(w)]
            theirs = [w for w in replaced if is_name(w)]
            if ours and theirs and not {w.lower() for w in ours} & {w.lower() for w in theirs}:
                swaps.append((ours[0], theirs[-1] if after else theirs[0]))
    return swaps


def _supported_synthesis(
    raw: str, read: list[Source], picked: list[int], embed, question: str = ""
) -> str:
    """The synthesis's sentences that the support check accepts, in the prompt's numbering. A
    sentence the model left without a marker cites the source of its evidence (`picked`), when that
    is one source."""
    evidence_sources = list(dict.fromkeys(picked))
    kept, changed = [], False
    for sentence in split_sentences(raw):
        if is_refusal(sentence):
            changed = True
            continue
        if not parse_markers(sentence) and len(evidence_sources) == 1:
            sentence = f"{sentence.rstrip()} [{evidence_sources[0]}]"
            changed = True
        cited_n = set(parse_markers(sentence))
        cited = " ".join(f"{src.title} {src.passage}" for src in read if src.n in cited_n)
        if (
            _synthesis_supported(sentence, read, embed)
            and len(grafted_words(sentence, cited, question)) < 2
            and not swapped_names(
                sentence, " ".join(src.passage for src in read if src.n in cited_n)
            )
        ):
            kept.append(sentence)
        else:
            changed = True
    # Unchanged, the text stays as it streamed (its line breaks too).
    return " ".join(kept) if changed else raw


_CLAUSE_END = re.compile(r"(?:\s*\[\d+(?:\s*[,;]\s*\d+)*\])+")
_EXAMPLE_WORDS = [
    w
    for turn in prompts.EVIDENCE_EXAMPLE_TURNS
    if turn["role"] == "assistant"
    for w in [keyword_terms(turn["content"])]
][0]


def _synthesis_supported(sentence: str, read: list[Source], embed) -> bool:
    """A synthesis sentence the support check accepts whole and clause by clause (each stretch of
    text up to a marker is checked against what that marker cites: "X [1] and Y [1]" with Y from the
    source and X invented fails), and that repeats no run of four words of the worked example its
    sources lack (a small model copies the example's answer into a sentence about something else).
    """
    report = check_support(sentence, read, embed=embed)
    if not report.citations or report.unsupported:
        return False
    clauses = [m for m in re.finditer(rf".+?{_CLAUSE_END.pattern}", sentence)]
    if len(clauses) > 1:
        for m in clauses:
            clause = m.group(0).strip(" ,;")
            if is_claim(clause) and check_support(clause, read, embed=embed).unsupported:
                return False
    words = keyword_terms(sentence)
    cited = " ".join(src.passage for src in read if src.n in set(parse_markers(sentence)))
    example = {tuple(_EXAMPLE_WORDS[i : i + 4]) for i in range(len(_EXAMPLE_WORDS) - 3)}
    passage = set(keyword_terms(cited))
    return not any(
        tuple(words[i : i + 4]) in example and not set(words[i : i + 4]) <= passage
        for i in range(len(words) - 3)
    )


def _quote_block(
    quotes: list[tuple[int, str]], shown: list[evidence.ShownSource], list_question: bool
) -> str:
    """The evidence sentences as lines, each with its [n] (the prompt's numbering): under a
    synthesis, up to MAX_QUOTES of them; for a "which papers" question, one line per paper, its
    title first."""
    if list_question:
        first: dict[int, str] = {}
        for n, q in quotes:
            first.setdefault(n, q)
        return "\n".join(
            f"- {escape_quote(shown[n - 1].title)}: {escape_quote(q)} [{n}]"
            for n, q in first.items()
        )
    return "\n".join(f"- {escape_quote(q)} [{n}]" for n, q in quotes[:MAX_QUOTES])


def _unanswered(
    settings: Settings,
    embed,
    question: str,
    hits: list[Hit],
    sources: list[Source],
    shown: list[evidence.ShownSource],
    quotes: list[tuple[int, str]],
    answerable: float | None,
    by: Literal[
        "check", "evidence", "support", "answer_type", "answer_source", "answer_names", "topic"
    ],
    usage: Usage | None,
    streamed: bool = False,
    among: list[int] | None = None,
    absent: list[str] | None = None,
    unwritten: list[str] | None = None,
) -> Generator[str, None, Answer]:
    """The answer when no sentence states what was asked: `not_stated` with the closest sentences
    quoted when the papers are on the subject (a name of the question in a retrieved paper, or the
    best dense similarity at least `not_stated_threshold`), else `not_covered`. Without quotes, the
    sentence closest to the question among the sources numbered `among` (default: the first two) is
    quoted. `absent`: the question's terms none of the papers holds, named in the answer;
    `unwritten`: its names that none of the papers the answer cited mentions
    (rag/answer/answer_type.py's `unwritten_names`), named likewise."""
    on_topic = on_the_subject(hits, settings.not_stated_threshold)
    terms = named(absent or unwritten or [])
    if not on_topic or not shown or not any(s.sentences for s in shown):
        refusal = (
            prompts.ABSENT_TOPIC_ANSWER.format(terms=terms)
            if absent
            else prompts.UNWRITTEN_NAMES_ANSWER.format(terms=terms)
            if unwritten
            else prompts.ABSTAIN_ANSWER
        )
        yield ("\n\n" if streamed else "") + refusal
        return Answer(
            question=question,
            answer=refusal,
            mode="llm",
            outcome="not_covered",
            abstained_by=by,
            answerable=answerable,
            sources=sources,
            usage=usage,
        )
    if not quotes:
        import numpy as np

        candidates = [
            (s.n, t)
            for s in shown
            if s.n in (among or (1, 2))
            for t in s.sentences
            if not BOILERPLATE.search(t)
        ]
        if candidates:
            vectors = np.asarray(embed([question, *(t for _, t in candidates)]), dtype=np.float32)
            quotes = [candidates[int(np.argmax(vectors[1:] @ vectors[0]))]]
    lines = "\n".join(f"- {escape_quote(q)} [{n}]" for n, q in quotes[:2])
    lead = (
        prompts.ABSENT_TOPIC_LEAD.format(terms=terms)
        if absent
        else prompts.UNWRITTEN_NAMES_LEAD.format(terms=terms)
        if unwritten
        else prompts.NOT_STATED_LEAD
    )
    text, final_sources, _ = renumber(f"{lead}\n{lines}", sources)
    yield ("\n\n" if streamed else "") + text
    quoted = {sources[n - 1].paper_id: [q for m, q in quotes[:2] if m == n] for n, _ in quotes[:2]}
    final_sources = [
        s.model_copy(
            update={
                "evidence": quoted.get(s.paper_id, []),
            }
        )
        for s in final_sources
    ]
    citations = [
        Citation(n=s.n, paper_id=s.paper_id, supported=True) for s in final_sources if s.cited
    ]
    return Answer(
        question=question,
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
