"""The LLM path: a prompt of numbered sources, a streamed answer, checked citations.

Any failure of the endpoint becomes an extractive answer with `error` set: the sources are
still shown. Messages name the setting to check and never contain the API key.
"""

from __future__ import annotations

from collections.abc import Iterator

from . import prompts
from .chunking import count_tiktoken
from .citations import grounding, renumber
from .errors import LLMError
from .models import Answer, Source, Usage


def build_messages(question: str, sources: list[Source], budget_tokens: int):
    """System + user messages; the weakest sources are dropped first to fit the token budget."""
    from llama_index.core.llms import ChatMessage

    blocks, used = [], 0
    for s in sources:
        block = prompts.SOURCES_TEMPLATE.format(n=s.n, title=s.title, passage=s.passage)
        cost = count_tiktoken(block)
        if blocks and used + cost > budget_tokens:
            break
        blocks.append(block)
        used += cost
    user = prompts.QUESTION_TEMPLATE.format(sources="\n\n".join(blocks), question=question)
    return [ChatMessage(role="system", content=prompts.SYSTEM_PROMPT), ChatMessage(role="user", content=user)]


def describe_failure(exc: Exception, settings) -> str:
    """One line naming the cause and the setting to check (never the key)."""
    name = type(exc).__name__
    text = str(exc)
    key = settings.openai_api_key
    if key:
        text = text.replace(key, "***")
    where = settings.openai_base_url or "https://api.openai.com/v1"
    if "401" in text or "Authentication" in name:
        return f"the LLM endpoint {where} rejected the API key (401); check OPENAI_API_KEY"
    if "404" in text or "NotFound" in name:
        return f"the LLM endpoint {where} does not know model {settings.llm_model!r}; check RAG_LLM_MODEL"
    if "Timeout" in name:
        return f"the LLM endpoint {where} timed out; check OPENAI_BASE_URL or raise RAG_LLM_TIMEOUT"
    if "Connection" in name or "connect" in text.lower():
        return f"cannot connect to the LLM endpoint {where}; is the server running? check OPENAI_BASE_URL"
    if "429" in text or "RateLimit" in name:
        return f"the LLM endpoint {where} is rate limiting (429); wait and retry or raise RAG_LLM_RETRIES"
    return f"the LLM call to {where} failed ({name}); check OPENAI_BASE_URL and RAG_LLM_MODEL"


def generate(rag, question: str, query: str, hits, sources: list[Source]) -> Iterator[str | Answer]:
    """Stream the LLM's answer, then yield the checked `Answer` (extractive fallback on failure)."""
    settings = rag.settings
    messages = build_messages(question, sources, settings.llm_context_tokens)
    pieces: list[str] = []
    usage = None
    try:
        llm = rag.llm
        for chunk in llm.stream_chat(messages):
            if chunk.delta:
                pieces.append(chunk.delta)
                yield chunk.delta
            raw = getattr(chunk, "raw", None)
            raw_usage = getattr(raw, "usage", None) if raw is not None else None
            if raw_usage:
                usage = Usage(prompt_tokens=raw_usage.prompt_tokens or 0,
                              completion_tokens=raw_usage.completion_tokens or 0,
                              total_tokens=raw_usage.total_tokens or 0)
    except Exception as exc:  # the endpoint's failures are many types; all become one clear line
        error = describe_failure(exc, settings)
        if pieces:
            yield "\n\n"
        fallback = rag._extractive(question, query, hits, sources, error=error)
        yield fallback.answer
        yield fallback
        return
    text = "".join(pieces).strip()
    if usage is None:
        prompt_tokens = sum(count_tiktoken(m.content or "") for m in messages)
        completion = count_tiktoken(text)
        usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                      total_tokens=prompt_tokens + completion)
    if not text or prompts.REFUSAL.lower().rstrip(".") in text.lower():
        yield Answer(question=question, answer=prompts.ABSTAIN_ANSWER, mode="llm", abstained=True,
                     sources=sources, usage=usage)
        return
    new_text, citations, renumbered, _invalid = renumber(text, sources)
    yield Answer(question=question, answer=new_text, mode="llm", citations=citations, sources=renumbered,
                 grounding=grounding(citations), usage=usage)


def rewrite_with_llm(rag, message: str, turns: list[dict]) -> str:
    from llama_index.core.llms import ChatMessage

    history = "\n".join(f"{t['role']}: {str(t['content'])[:500]}" for t in turns[-6:])
    prompt = prompts.REWRITE_PROMPT.format(history=history, message=message)
    try:
        reply = rag.llm.chat([ChatMessage(role="user", content=prompt)])
    except Exception as exc:
        raise LLMError(describe_failure(exc, rag.settings)) from None
    text = (reply.message.content or "").strip().splitlines()
    return text[0].strip() if text else ""
