"""Answering, given its parts: the settings, the embedder, the chat backend, the store, the hits and
their sources. `respond` decides between the three answers: an abstention (nothing retrieved is
close enough, or the question names something no indexed paper mentions), an extractive answer
(sentences quoted from the abstracts) and a generated one (the LLM's, streamed, renumbered as it
arrives, its citations checked). Any failure of the LLM endpoint becomes an extractive answer with
`error` set, so the sources are still shown. The question itself (validation, follow-ups made standalone)
is rag/answer/question.py's.

Answers stream: each function that produces one is a generator that yields the text pieces (`str`)
and returns the final `Answer`; `rag.models.AnswerStream` wraps it for callers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Literal

from rag import prompts
from rag.answer import evidence
from rag.answer.citations import (
    MarkerRewriter,
    check_support,
    escape_quote,
    is_claim,
    parse_markers,
    renumber,
    renumber_sources,
    split_sentences,
)
from rag.answer.injection import StreamGuard, allowed_codes, clean_answer, instruction_sentences, sanitize
from rag.answer.question import LLMGetter
from rag.config import Settings
from rag.errors import LLMError
from rag.models import Answer, Citation, Reading, Source, Usage
from rag.text import count_tiktoken, keyword_terms

if TYPE_CHECKING:
    from rag.backends.chat import ChatModel
    from rag.backends.embedders import Embedder
    from rag.index.store import Store
    from rag.retrieve.search import Hit


class ReadingClock:
    """How fast the chat model reads a prompt, measured on the answers it gives (time to its first piece
    over the tokens of the question's message: the fixed prefix stays cached), and the estimate shown
    while it reads the next one. One per engine; before its first measurement it assumes
    `DEFAULT_READING_RATE` for a local model and gives no estimate for an endpoint."""

    def __init__(self, rate: float | None = None) -> None:
        self.rate = rate
        self._tokens = 0
        self._start = 0.0

    def reading(self, messages: list[dict], n_sources: int) -> Reading:
        """The piece that says the model starts reading `messages`; the wait is timed from here."""
        self._tokens = count_tiktoken(messages[-1]["content"])
        self._start = time.perf_counter()
        return Reading(n_sources, round(self._tokens / self.rate, 1) if self.rate else None)

    def timed(self, pieces: Iterator[str | Usage]) -> Iterator[str | Usage]:
        """`pieces`, the wait for the first one measured (a model loading, and the answerability check, included:
        the reader waits for them too)."""
        first = True
        for piece in pieces:
            if first:
                first = False
                rate = self._tokens / max(time.perf_counter() - self._start, 1e-3)
                self.rate = rate if self.rate is None else (self.rate + rate) / 2
            yield piece


# Tokens a second Qwen2.5-Coder-1.5B (Q4_K_M) reads on two idle cores with the generic llama.cpp build
# (measured: 48-63): the first estimate, until the engine has timed its own.
DEFAULT_READING_RATE = 50.0

# Sentences that say where the code is, not what the paper found.
_BOILERPLATE = re.compile(r"https?://|github\.com|\b(?:code|data|dataset|models?) (?:is|are) (?:publicly )?(?:available|released)", re.I)


# ---- which answer --------------------------------------------------------------------------------


def respond(settings: Settings, store: Store, embedder: Embedder, llm: LLMGetter | None, question: str,
            query: str, hits: list[Hit], sources: list[Source],
            clock: ReadingClock | None = None) -> Generator[str, None, Answer]:
    """Yield the answer's text as it is produced and return the `Answer`: an abstention, the extractive
    answer (`llm` None) or the LLM's. `query` is what was retrieved with (the rewritten follow-up). With
    an LLM, an empty piece comes first: the sources are found and the model starts reading them."""
    mode: Literal["llm", "extractive"] = "extractive" if llm is None else "llm"
    if should_abstain(settings, store, query, hits):
        answer = Answer(question=question, answer=prompts.ABSTAIN_ANSWER, abstained=True, abstained_by="retrieval",
                        mode=mode, sources=sources)
        yield answer.answer
        return answer
    if llm is None:
        answer = extractive(embedder, question, query, hits, sources)
        yield answer.answer
        return answer
    # The generated answers start with an empty piece (`Reading`): the sources are found and the model
    # starts reading them, which takes seconds on a CPU before its first word; the CLI and the UI show it.
    answer_with = generated_evidence if settings.answer_style == "evidence" else generated
    return (yield from answer_with(settings, embedder, llm, question, query, hits, sources, clock))


def should_abstain(settings: Settings, store: Store, query: str, hits: list[Hit]) -> bool:
    """The retrieval rule: nothing retrieved, a name no indexed paper mentions, or nothing close enough."""
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


# ---- the extractive answer -----------------------------------------------------------------------


def extractive(embedder: Embedder, question: str, query: str, hits: list[Hit], sources: list[Source],
               error: str | None = None) -> Answer:
    """Quote the sentences of the top papers closest to the question, each with its [n]. With `error`
    (why the LLM failed), the fallback of a generated answer."""
    import numpy as np

    candidates: list[tuple[int, str]] = []
    for i, hit in enumerate(hits[:5], 1):
        # Never quote an instruction planted in an abstract (rag/answer/injection.py), nor a sentence on code.
        dropped = instruction_sentences(hit.chunk.abstract)
        candidates.extend((i, s) for s, bad in list(zip(split_sentences(hit.chunk.abstract), dropped))[:12]
                          if len(s) > 30 and not bad and not _BOILERPLATE.search(s))
    if not candidates:
        return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, abstained=True,
                      mode="extractive", sources=sources, error=error)
    vectors = np.array(embedder.embed([s for _, s in candidates], truncate=True))
    q = np.array(embedder.embed_query(query))
    rank_bonus = {i: 0.05 * (len(hits) - i) / max(len(hits), 1) for i in range(1, len(hits) + 1)}
    scores = vectors @ q + np.array([rank_bonus[i] for i, _ in candidates])
    picked: list[tuple[int, str]] = []
    per_paper: dict[int, int] = {}
    best = float(scores.max())
    for j in np.argsort(-scores):
        i, sentence = candidates[j]
        if scores[j] < 0.6 * best or len(picked) >= 4:
            break
        if per_paper.get(i, 0) >= 2:
            continue
        per_paper[i] = per_paper.get(i, 0) + 1
        picked.append((i, sentence))
    # Numbered here, not by parsing the text: a bracket inside a quote ("W[1]-hard") is the
    # abstract's text, kept verbatim and escaped, never a citation.
    order = list(dict.fromkeys(i for i, _ in picked))
    text = "\n".join(f"- {escape_quote(s)} [{order.index(i) + 1}]" for i, s in picked)
    renumbered = renumber_sources(sources, order)
    label = prompts.EXTRACTIVE_LABEL if error is None else prompts.FALLBACK_LABEL
    # Quoted sentences support themselves: every citation is supported.
    citations = [Citation(n=s.n, paper_id=s.paper_id, supported=True) for s in renumbered if s.cited]
    quoted = {s.paper_id: [q for i, q in picked if sources[i - 1].paper_id == s.paper_id] for s in renumbered}
    abstracts = {h.paper.paper_id: h.chunk.abstract for h in hits}
    # A quote may come from another chunk of the abstract than the one retrieved: the passage shown
    # for a citation is then the abstract, the text that holds it.
    renumbered = [s.model_copy(update={"evidence": quoted[s.paper_id]} | (
        {"passage": abstracts[s.paper_id]} if any(q not in s.passage for q in quoted[s.paper_id]) else {}))
        for s in renumbered]
    return Answer(question=question, answer=f"{label}\n{text}", mode="extractive",
                  citations=citations, sources=renumbered, grounding=1.0, error=error)


# ---- the generated answer ------------------------------------------------------------------------


def trim_passages(question: str, passages: list[str], max_tokens: int,
                  embed: Callable[[list[str]], Sequence[Sequence[float]]] | None = None) -> list[str]:
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
        out.append(" ".join(sentences[i] for i in evidence.best_within(sentences, score, max_tokens)))
    return out


def build_messages(question: str, sources: list[Source], budget_tokens: int, source_tokens: int | None = None,
                   embed: Callable[[list[str]], Sequence[Sequence[float]]] | None = None) -> tuple[list[dict], int]:
    """System + user messages and how many sources fit: each passage (its title, which the chunk
    repeats, dropped) trimmed to `source_tokens` with `trim_passages`, the weakest sources dropped
    first when the whole exceeds `budget_tokens`."""
    passages = [sanitize(_without_title(s.passage, s.title)).text for s in sources]
    if source_tokens:
        passages = trim_passages(question, passages, source_tokens, embed)
    blocks: list[str] = []
    used = 0
    for s, passage in zip(sources, passages):
        block = prompts.SOURCE_TEMPLATE.format(n=s.n, title=sanitize(s.title, title=True).text, passage=passage)
        cost = count_tiktoken(block)
        if blocks and used + cost > budget_tokens:
            break
        blocks.append(block)
        used += cost
    user = prompts.QUESTION_TEMPLATE.format(sources="\n\n".join(blocks), question=question)
    return ([{"role": "system", "content": prompts.SYSTEM_PROMPT}, *prompts.EXAMPLE_TURNS,
             {"role": "user", "content": user}], len(blocks))


def _without_title(passage: str, title: str) -> str:
    return passage[len(title):].lstrip() if title and passage.startswith(title) else passage


def is_refusal(text: str) -> bool:
    core = prompts.REFUSAL.lower().rstrip(".")
    return not text.strip() or core in " ".join(text.lower().split())


def answerable_probability(backend: ChatModel, messages: list[dict]) -> float:
    """The model's probability that the sources answer the question: P(yes) / (P(yes) + P(no)) for one
    token after `CHECK_PROMPT`, asked as a turn after the same prompt. A server or in-process llama.cpp
    keeps that prompt cached, so the check reads only its own few tokens and the answer that follows
    (the same prompt without the check turn) reads nothing again."""
    return backend.yes_probability(messages + [{"role": "user", "content": prompts.CHECK_PROMPT}])


def generated(settings: Settings, embedder: Embedder, llm: LLMGetter, question: str, query: str,
              hits: list[Hit], sources: list[Source], clock: ReadingClock | None = None) -> Generator[str, None, Answer]:
    """Stream the LLM's answer (markers already renumbered), then return the checked `Answer`: withdrawn
    (abstained) when the model refuses, fails the answerability check (`llm_check`), cites nothing
    supported (`llm_require_support`) or has nothing cited left once the injection filter is done;
    the extractive answer with `error` set when the LLM fails."""
    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        return embedder.embed(texts, truncate=True)

    messages, n_prompt = build_messages(question, sources, settings.llm_context_tokens, settings.llm_source_tokens,
                                        embed=embed)
    clock = clock or ReadingClock()
    yield clock.reading(messages, n_prompt)
    rewriter = MarkerRewriter(n_prompt)
    # What the sources held as instructions, and the links they give: the answer may repeat neither
    # the one nor any other link (see rag/answer/injection.py).
    removed = [r for src in sources[:n_prompt] for r in sanitize(src.passage).removed]
    allowed_urls = [src.url for src in sources if src.url]
    # The output rule (rag/answer/injection.py): codes and URLs only from content that relates to the question.
    codes = allowed_codes(question, [(src.title, src.passage) for src in sources[:n_prompt]], embed)
    guard = StreamGuard(messages[-1]["content"], allowed_urls, removed, question, codes=codes)
    shown: list[str] = []
    usage = None
    try:
        backend = llm()
        answerable = None
        if settings.llm_check:
            answerable = answerable_probability(backend, messages)
            if answerable < settings.llm_check_threshold:
                yield prompts.ABSTAIN_ANSWER
                return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                              abstained_by="check", answerable=answerable, sources=sources,
                              usage=_complete_usage(None, messages, "no", backend))
        for item in clock.timed(backend.stream(messages)):
            if isinstance(item, Usage):
                usage = item
                continue
            out = rewriter.feed(item)
            if out:
                shown.append(out)
                live = guard.feed(out)
                if live:
                    yield live
        tail = rewriter.close()
        if tail:
            shown.append(tail)
        live = guard.feed(tail) + guard.close()
        if live:
            yield live
    except LLMError as exc:
        return (yield from _llm_failed(exc, bool(shown), embedder, question, query, hits, sources))
    text = "".join(shown).strip()
    usage = _complete_usage(usage, messages, text, backend)
    if is_refusal(text):
        return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                      abstained_by="model", answerable=answerable, sources=sources, usage=usage)
    final_sources = renumber_sources(sources, rewriter.order)
    cleaned = clean_answer(text, messages[-1]["content"], allowed_urls, removed, question, codes=codes)
    if cleaned.dropped:
        # Sentences and links only an injection would write: taken out, citations renumbered.
        text, final_sources, _ = renumber(cleaned.text, final_sources)
        if not text.strip() or not any(src.cited for src in final_sources):
            return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                          abstained_by="filter", answerable=answerable, sources=sources, usage=usage,
                          withdrawn=cleaned.text, filtered=cleaned.dropped)
    report = check_support(text, final_sources, embed=embed)
    final_sources = [src.model_copy(update={"evidence": report.evidence.get(src.n, [])}) for src in final_sources]
    if settings.llm_require_support and not any(c.supported for c in report.citations):
        # Streamed, then checked: no claim stands on the passage it cites (or none cites one), which is
        # how a small model answers a question its sources only touch: withdrawn, the text kept aside.
        return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                      abstained_by="support", answerable=answerable, sources=sources, usage=usage,
                      withdrawn=text)
    return Answer(question=question, answer=text, mode="llm", citations=report.citations, sources=final_sources,
                  grounding=report.grounding, usage=usage, uncited_sentences=report.uncited,
                  removed_markers=rewriter.invalid, answerable=answerable, filtered=cleaned.dropped)


def _llm_failed(exc: LLMError, streamed: bool, embedder: Embedder, question: str, query: str, hits: list[Hit],
                sources: list[Source]) -> Generator[str, None, Answer]:
    """The extractive answer with `error` set, after what the model had streamed (kept, set apart)."""
    if streamed:
        yield "\n\n"
    fallback = extractive(embedder, question, query, hits, sources, error=str(exc))
    yield fallback.answer
    return fallback


def _complete_usage(usage: Usage | None, messages: list[dict], text: str, backend: ChatModel) -> Usage:
    """The server's usage when it reported one, else tiktoken counts; with a cost estimate."""
    if usage is None:
        prompt = sum(count_tiktoken(m["content"]) + 4 for m in messages)
        completion = count_tiktoken(text)
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                      estimated=True)
    return usage.model_copy(update={"cost_usd": backend.cost(usage.prompt_tokens, usage.completion_tokens)})


# ---- the evidence-first answer -------------------------------------------------------------------

MAX_QUOTES = 4  # sentences quoted under a synthesis (a "which papers" list quotes one per paper)


def generated_evidence(settings: Settings, embedder: Embedder, llm: LLMGetter, question: str, query: str,
                       hits: list[Hit], sources: list[Source],
                       clock: ReadingClock | None = None) -> Generator[str, None, Answer]:
    """Stream an evidence-first answer (rag/answer/evidence.py) and return the checked `Answer`.

    The model names the sentences that state the answer and writes a short synthesis; the answer is
    the synthesis (its unsupported sentences dropped) followed by those sentences quoted, or, for a
    "which papers" question, one line per paper with its sentence. When the model names no sentence,
    the outcome is `not_stated` (the papers are on the subject: their closest sentence is quoted) or
    `not_covered`. A failure of the LLM gives the extractive answer with `error` set."""
    def embed(texts: list[str]) -> Sequence[Sequence[float]]:
        return embedder.embed(texts, truncate=True)

    list_question = evidence.is_list_question(question)
    sentences = evidence.choose_sentences(
        question, [evidence.source_sentences(h.chunk.abstract) for h in hits],
        settings.llm_top_source_tokens or 10**6, settings.llm_source_tokens or 10**6, embed)
    shown = [evidence.ShownSource(s.n, evidence.plain_prose(sanitize(s.title, title=True).text), chosen)
             for s, chosen in zip(sources, sentences)]
    messages, n_prompt = evidence.build_messages(question, shown, settings.llm_context_tokens, list_question)
    clock = clock or ReadingClock()
    yield clock.reading(messages, n_prompt)
    parser = evidence.ReplyParser(n_prompt, shown)
    rewriter = MarkerRewriter(n_prompt)
    removed = [r for src in sources[:n_prompt] for r in sanitize(src.passage).removed]
    allowed_urls = [src.url for src in sources if src.url]
    # The output rule (rag/answer/injection.py): codes and URLs only from content that relates to the question.
    codes = allowed_codes(question, [(src.title, src.passage) for src in sources[:n_prompt]], embed)
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
        return (yield from _llm_failed(exc, started, embedder, question, query, hits, sources))
    raw = "".join(synthesis).strip()
    usage = _complete_usage(usage, messages, raw, backend)
    # The synthesis as it stands in the prompt's numbering, each sentence checked against the sentences
    # the model read of the source it cites; unsupported ones are dropped (the quotes stay). Only what is
    # kept steers which sentences are quoted.
    read = [src.model_copy(update={"passage": " ".join(s.sentences)}) for src, s in zip(sources[:n_prompt], shown)]
    kept = _supported_synthesis(raw, read, [n for n, _ in parser.evidence], embed, question)
    settled = evidence.settle_evidence(parser.evidence, shown, kept, question, list_question, embed)
    if not settled and raw and not parser.none and not is_refusal(raw):
        # The model answered without naming sentences, and its own words did not hold up: quote, from the
        # sources it cited, the sentences its claims meant.
        settled = evidence.settle_evidence([], shown, raw, question, list_question, embed)
    quotes = [(n, shown[n - 1].sentences[i - 1]) for n, i in settled]
    quotes = [(n, q) for n, q in quotes if not _BOILERPLATE.search(q)]
    kept = _without_copies(kept, [q for _, q in quotes])
    if settings.llm_check and quotes and not parser.none:
        # The narrow check: do the quoted sentences state the answer? Asked after the reply, on its cached prompt.
        try:
            answerable = evidence_check(backend, messages, "".join(replied), [q for _, q in quotes])
        except LLMError:
            answerable = None
        if answerable is not None and answerable < settings.llm_check_threshold:
            tail = guard.feed(rewriter.close()) + guard.close()
            if tail.strip():
                yield tail
            return (yield from _unanswered(settings, embed, question, hits, sources, shown, quotes, answerable,
                                           "check", usage, streamed=started))
    if parser.none or (raw and is_refusal(raw)) or not (raw or quotes):
        tail = guard.feed(rewriter.close()) + guard.close()
        if tail.strip():
            yield tail
        return (yield from _unanswered(settings, embed, question, hits, sources, shown, quotes, answerable, "evidence",
                                       usage, streamed=bool("".join(synthesis).strip())))
    block = _quote_block(quotes, shown, list_question)
    tail = rewriter.feed("\n\n" + block) if block else ""
    live = guard.feed(tail + rewriter.close()) + guard.close()
    if live:
        yield live
    text = (kept + "\n\n" + block).strip() if block else kept
    if not text:
        return (yield from _unanswered(settings, embed, question, hits, sources, shown, quotes, answerable, "support",
                                       usage, streamed=True))
    cleaned = clean_answer(text, messages[-1]["content"], allowed_urls, removed, question, codes=codes)
    text, final_sources, invalid = renumber(cleaned.text, read + sources[n_prompt:])
    if not text.strip() or not any(src.cited for src in final_sources):
        return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                      abstained_by="filter", answerable=answerable, sources=sources, usage=usage,
                      withdrawn=cleaned.text, filtered=cleaned.dropped)
    report = check_support(text, final_sources, embed=embed)
    # Shown with each cited source: the sentences quoted from it (else those closest to the claims citing
    # it), in the retrieved passage, or in the whole abstract when a quote comes from another chunk.
    by_id = {h.paper.paper_id: (src.passage, h.chunk.abstract) for h, src in zip(hits, sources)}
    final_sources = [_with_evidence(src, [q for n, q in quotes if read[n - 1].paper_id == src.paper_id]
                                    or report.evidence.get(src.n, []), *by_id[src.paper_id])
                     for src in final_sources]
    return Answer(question=question, answer=text, mode="llm", citations=report.citations, sources=final_sources,
                  grounding=report.grounding, usage=usage, uncited_sentences=report.uncited,
                  removed_markers=rewriter.invalid + invalid, answerable=answerable, filtered=cleaned.dropped)


def evidence_check(backend: ChatModel, messages: list[dict], reply: str, sentences: list[str]) -> float:
    """The model's probability that the `sentences` it named state the answer, not only its subject: P(yes)
    of one token, asked as a turn after its own reply. The conversation so far is what llama.cpp holds in
    its cache, so the check reads a few dozen tokens; a prompt of its own would evict the cached system
    prompt and cost the next question seconds."""
    listed = "\n".join(f"- {s}" for s in sentences)
    return backend.yes_probability([*messages, {"role": "assistant", "content": reply or "EVIDENCE: NONE"},
                                    {"role": "user", "content": prompts.EVIDENCE_CHECK_PROMPT.format(sentences=listed)}])


def _without_copies(synthesis: str, quotes: list[str]) -> str:
    """The synthesis without its sentences that only repeat a quoted sentence (the quote says it, exactly)."""
    if not synthesis or not quotes:
        return synthesis
    quoted = [set(keyword_terms(q)) for q in quotes]
    kept = []
    for sentence in split_sentences(synthesis):
        words = set(keyword_terms(sentence))
        if words and any(len(words & q) >= 0.8 * len(words) and len(words & q) >= 0.8 * len(q) for q in quoted):
            continue
        kept.append(sentence)
    return synthesis if len(kept) == len(split_sentences(synthesis)) else " ".join(kept)


def _with_evidence(source: Source, sentences: list[str], passage: str, abstract: str) -> Source:
    inside = all(" ".join(q.split()) in " ".join(passage.split()) for q in sentences)
    return source.model_copy(update={"evidence": sentences, "passage": passage if inside else abstract})


def grafted_words(sentence: str, cited: str, question: str) -> list[str]:
    """Words of a synthesis sentence that its cited text lacks and the question holds: a small model asked
    "how do knowledge graph embeddings do link prediction?" writes "Knowledge graph embedding methods do
    link prediction by <what an unrelated abstract says>". Two or more mark the sentence unsupported
    (measured on the audited sentences of docs/answers.md: 3 of 8 unsupported caught, 0 of 42 supported)."""
    source = set(keyword_terms(cited))
    asked = set(keyword_terms(question))
    return [w for w in dict.fromkeys(keyword_terms(sentence)) if len(w) >= 4 and w in asked and w not in source]


def _supported_synthesis(raw: str, read: list[Source], picked: list[int], embed, question: str = "") -> str:
    """The synthesis's sentences that the support check accepts, in the prompt's numbering. A sentence
    the model left without a marker cites the source of its evidence (`picked`), when that is one source."""
    evidence_sources = list(dict.fromkeys(picked))
    kept, changed = [], False
    for sentence in split_sentences(raw):
        if is_refusal(sentence):
            changed = True
            continue
        if not parse_markers(sentence) and len(evidence_sources) == 1:
            sentence = f"{sentence.rstrip()} [{evidence_sources[0]}]"
            changed = True
        cited = " ".join(f"{src.title} {src.passage}" for src in read if src.n in set(parse_markers(sentence)))
        if _synthesis_supported(sentence, read, embed) and len(grafted_words(sentence, cited, question)) < 2:
            kept.append(sentence)
        else:
            changed = True
    # Unchanged, the text stays as it streamed (its line breaks too).
    return " ".join(kept) if changed else raw


_CLAUSE_END = re.compile(r"(?:\s*\[\d+(?:\s*[,;]\s*\d+)*\])+")
_EXAMPLE_WORDS = [w for turn in prompts.EVIDENCE_EXAMPLE_TURNS if turn["role"] == "assistant"
                  for w in [keyword_terms(turn["content"])]][0]


def _synthesis_supported(sentence: str, read: list[Source], embed) -> bool:
    """A synthesis sentence the support check accepts whole and clause by clause (each stretch of text
    up to a marker is checked against what that marker cites: "X [1] and Y [1]" with Y from the source
    and X invented fails), and that repeats no run of four words of the worked example its sources lack
    (a small model copies the example's answer into a sentence about something else)."""
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
    example = {tuple(_EXAMPLE_WORDS[i:i + 4]) for i in range(len(_EXAMPLE_WORDS) - 3)}
    passage = set(keyword_terms(cited))
    return not any(tuple(words[i:i + 4]) in example and not set(words[i:i + 4]) <= passage
                   for i in range(len(words) - 3))


def _quote_block(quotes: list[tuple[int, str]], shown: list[evidence.ShownSource], list_question: bool) -> str:
    """The evidence sentences as lines, each with its [n] (the prompt's numbering): under a synthesis, up
    to MAX_QUOTES of them; for a "which papers" question, one line per paper, its title first."""
    if list_question:
        first: dict[int, str] = {}
        for n, q in quotes:
            first.setdefault(n, q)
        return "\n".join(f"- {escape_quote(shown[n - 1].title)}: {escape_quote(q)} [{n}]" for n, q in first.items())
    return "\n".join(f"- {escape_quote(q)} [{n}]" for n, q in quotes[:MAX_QUOTES])


def _unanswered(settings: Settings, embed, question: str, hits: list[Hit], sources: list[Source],
                shown: list[evidence.ShownSource], quotes: list[tuple[int, str]], answerable: float | None,
                by: Literal["check", "evidence", "support"], usage: Usage | None,
                streamed: bool = False) -> Generator[str, None, Answer]:
    """The answer when no sentence states what was asked: `not_stated` with the closest sentences quoted
    when the papers are on the subject (a name of the question in a retrieved paper, or the best dense
    similarity at least `not_stated_threshold`), else `not_covered`."""
    sims = [h.similarity for h in hits if h.similarity is not None]
    on_topic = any(h.named for h in hits) or (bool(sims) and max(sims) >= settings.not_stated_threshold)
    if not on_topic or not shown or not any(s.sentences for s in shown):
        yield ("\n\n" if streamed else "") + prompts.ABSTAIN_ANSWER
        return Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", outcome="not_covered",
                      abstained_by=by, answerable=answerable, sources=sources, usage=usage)
    if not quotes:
        import numpy as np

        candidates = [(s.n, t) for s in shown[:2] for t in s.sentences if not _BOILERPLATE.search(t)]
        if candidates:
            vectors = np.asarray(embed([question, *(t for _, t in candidates)]), dtype=np.float32)
            quotes = [candidates[int(np.argmax(vectors[1:] @ vectors[0]))]]
    lines = "\n".join(f"- {escape_quote(q)} [{n}]" for n, q in quotes[:2])
    text, final_sources, _ = renumber(f"{prompts.NOT_STATED_LEAD}\n{lines}", sources)
    yield ("\n\n" if streamed else "") + text
    quoted = {sources[n - 1].paper_id: [q for m, q in quotes[:2] if m == n] for n, _ in quotes[:2]}
    final_sources = [s.model_copy(update={"evidence": quoted.get(s.paper_id, []),
                                          })
                     for s in final_sources]
    citations = [Citation(n=s.n, paper_id=s.paper_id, supported=True) for s in final_sources if s.cited]
    return Answer(question=question, answer=text, mode="llm", outcome="not_stated", abstained_by=by,
                  citations=citations, sources=final_sources, grounding=1.0, answerable=answerable, usage=usage)
