"""The LLM path: a prompt of numbered sources, a streamed answer renumbered as it arrives,
checked citations. Any failure of the endpoint becomes an extractive answer with `error` set,
so the sources are still shown."""

from __future__ import annotations

from collections.abc import Iterator

from . import prompts
from .chunking import count_tiktoken
from .citations import MarkerRewriter, check_support, renumber, renumber_sources, split_sentences
from .errors import LLMError
from .injection import StreamGuard, clean_answer, sanitize
from .keyword import tokenize
from .models import Answer, Source, Usage


def trim_passages(question: str, passages: list[str], max_tokens: int, embed=None) -> list[str]:
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
        asked = set(tokenize(question))
        scores = iter(len(asked & set(tokenize(s))) for s in flat)
    out = []
    for passage, sentences in zip(passages, split):
        if sentences is None:
            out.append(passage)
            continue
        score = [next(scores) for _ in sentences]
        keep, used = set(), 0
        for i in sorted(range(len(sentences)), key=lambda i: -score[i]):
            cost = count_tiktoken(sentences[i]) + 1
            if keep and used + cost > max_tokens:
                continue
            keep.add(i)
            used += cost
        out.append(" ".join(sentences[i] for i in sorted(keep)))
    return out


def build_messages(question: str, sources: list[Source], budget_tokens: int,
                   source_tokens: int | None = None, embed=None) -> tuple[list[dict], int]:
    """System + user messages and how many sources fit: each passage (its title, which the chunk
    repeats, dropped) trimmed to `source_tokens` with `trim_passages`, the weakest sources dropped
    first when the whole exceeds `budget_tokens`."""
    passages = [sanitize(_without_title(s.passage, s.title)).text for s in sources]
    if source_tokens:
        passages = trim_passages(question, passages, source_tokens, embed)
    blocks, used = [], 0
    for s, passage in zip(sources, passages):
        block = prompts.SOURCE_TEMPLATE.format(n=s.n, title=sanitize(s.title).text, passage=passage)
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


def answerable_probability(backend, messages: list[dict]) -> float:
    """The model's probability that the sources answer the question: P(yes) / (P(yes) + P(no)) for one
    token after `CHECK_PROMPT`, asked as a turn after the same prompt. A server or in-process llama.cpp
    keeps that prompt cached, so the check reads only its own few tokens and the answer that follows
    (the same prompt without the check turn) reads nothing again."""
    return backend.yes_probability(messages + [{"role": "user", "content": prompts.CHECK_PROMPT}])


def generate(rag, question: str, query: str, hits, sources: list[Source]) -> Iterator[str | Answer]:
    """Stream the LLM's answer (markers already renumbered), then yield the checked `Answer`."""
    settings = rag.settings
    messages, n_prompt = build_messages(question, sources, settings.llm_context_tokens, settings.llm_source_tokens,
                                        embed=lambda texts: rag.embedder.embed(texts, truncate=True))
    rewriter = MarkerRewriter(n_prompt)
    # What the sources held as instructions, and the links they give: the answer may repeat neither
    # the one nor any other link (see rag/injection.py).
    removed = [r for src in sources[:n_prompt] for r in sanitize(src.passage).removed]
    allowed_urls = [src.url for src in sources if src.url]
    guard = StreamGuard(messages[-1]["content"], allowed_urls, removed, question)
    shown: list[str] = []
    usage = None
    try:
        backend = rag.llm
        answerable = None
        if settings.llm_check:
            answerable = answerable_probability(backend, messages)
            if answerable < settings.llm_check_threshold:
                yield prompts.ABSTAIN_ANSWER
                yield Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                             abstained_by="check", answerable=answerable, sources=sources,
                             usage=_complete_usage(None, messages, "no", backend))
                return
        for item in backend.stream(messages):
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
        if shown:
            yield "\n\n"
        fallback = rag._extractive(question, query, hits, sources, error=str(exc))
        yield fallback.answer
        yield fallback
        return
    text = "".join(shown).strip()
    usage = _complete_usage(usage, messages, text, backend)
    if is_refusal(text):
        yield Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                     abstained_by="model", answerable=answerable, sources=sources, usage=usage)
        return
    final_sources = renumber_sources(sources, rewriter.order)
    cleaned = clean_answer(text, messages[-1]["content"], allowed_urls, removed, question)
    if cleaned.dropped:
        # Sentences and links only an injection would write: taken out, citations renumbered.
        text, final_sources, _ = renumber(cleaned.text, final_sources)
        if not text.strip() or not any(src.cited for src in final_sources):
            yield Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                         abstained_by="filter", answerable=answerable, sources=sources, usage=usage,
                         withdrawn=cleaned.text, filtered=cleaned.dropped)
            return
    report = check_support(text, final_sources, embed=lambda texts: rag.embedder.embed(texts, truncate=True))
    final_sources = [src.model_copy(update={"evidence": report.evidence.get(src.n, [])}) for src in final_sources]
    if settings.llm_require_support and not any(c.supported for c in report.citations):
        # Streamed, then checked: no claim stands on the passage it cites (or none cites one), which is
        # how a small model answers a question its sources only touch: withdrawn, the text kept aside.
        yield Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                     abstained_by="support", answerable=answerable, sources=sources, usage=usage,
                     withdrawn=text)
        return
    yield Answer(question=question, answer=text, mode="llm", citations=report.citations, sources=final_sources,
                 grounding=report.grounding, usage=usage, uncited_sentences=report.uncited,
                 removed_markers=rewriter.invalid, answerable=answerable, filtered=cleaned.dropped)


def _complete_usage(usage: Usage | None, messages: list[dict], text: str, backend) -> Usage:
    """The server's usage when it reported one, else tiktoken counts; with a cost estimate."""
    if usage is None:
        prompt = sum(count_tiktoken(m["content"]) + 4 for m in messages)
        completion = count_tiktoken(text)
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                      estimated=True)
    return usage.model_copy(update={"cost_usd": backend.cost(usage.prompt_tokens, usage.completion_tokens)})


def rewrite_with_llm(rag, message: str, turns: list[dict]) -> str:
    """A standalone question for a follow-up, written by the LLM."""
    history = "\n".join(f"{t['role']}: {str(t['content'])[:500]}" for t in turns[-6:])
    prompt = prompts.REWRITE_PROMPT.format(history=history, message=message)
    lines = rag.llm.complete([{"role": "user", "content": prompt}]).strip().splitlines()
    return lines[0].strip().strip('"') if lines else ""
