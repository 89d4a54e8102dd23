"""What the two generated answers (rag/answer/free.py, the free-form one;
rag/answer/evidence_answer.py, the evidence-first one) share: the clock that estimates how long the
model reads its prompt, the refusal test, the usage of a reply and the fallback when the LLM fails.
Apart so that neither style imports the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

from rag import prompts
from rag.answer.extractive import extractive
from rag.backends.cpu_share import CpuSample, busy_share
from rag.errors import LLMError
from rag.models import Answer, Reading, Source, Usage
from rag.text import count_tiktoken

if TYPE_CHECKING:
    from rag.answer.case import Case
    from rag.backends.chat import ChatModel


class ReadingClock:
    """How fast the chat model reads a prompt, measured on the answers it gives (time to its first
    piece over the tokens of the question's message: the fixed prefix stays cached), and the
    estimate shown while it reads the next one. One per engine, its timing per thread (a UI's
    sessions share the engine); before its first measurement it assumes `DEFAULT_READING_RATE` for
    a local model, slowed by the cores other processes kept busy since the question came
    (`mark`), and gives no estimate for an endpoint."""

    def __init__(self, rate: float | None = None) -> None:
        self.rate = rate
        self.measured = False  # whether `rate` is this engine's own measurement
        self._local = threading.local()  # this thread's question: its CPU sample, tokens, start

    def mark(self) -> None:
        """A question came: the machine's CPU time from here to `reading` says how busy it is."""
        self._local.since = CpuSample.now()

    def reading(self, messages: list[dict], papers: list[Source]) -> Reading:
        """The piece that says the model starts reading `messages` (the prompt of `papers`); the
        wait is timed from here."""
        local = self._local
        local.tokens = count_tiktoken(messages[-1]["content"])
        local.start = time.perf_counter()
        rate = self.rate
        if rate and not self.measured:
            since = getattr(local, "since", None)
            rate *= busy_share(since.others_cores(CpuSample.now()) if since else None)
        return Reading(papers, round(local.tokens / rate, 1) if rate else None)

    def timed(self, pieces: Iterator[str | Usage]) -> Iterator[str | Usage]:
        """`pieces`, the wait for the first one measured (a model loading, and the answerability
        check, included: the reader waits for them too)."""
        first = True
        for piece in pieces:
            if first:
                first = False
                elapsed = time.perf_counter() - getattr(self._local, "start", time.perf_counter())
                rate = getattr(self._local, "tokens", 0) / max(elapsed, 1e-3)
                self.rate = (self.rate + rate) / 2 if self.measured and self.rate else rate
                self.measured = True
            yield piece


WRITING_EVERY = 8  # a `Writing` piece every so many pieces of the model's reply

# Tokens a second Qwen2.5-Coder-1.5B (Q4_K_M) reads on two idle cores with the generic llama.cpp
# build (measured: 48-63): the first estimate, until the engine has timed its own.
DEFAULT_READING_RATE = 50.0


def is_refusal(text: str) -> bool:
    core = prompts.REFUSAL.lower().rstrip(".")
    return not text.strip() or core in " ".join(text.lower().split())


def llm_failed(exc: LLMError, case: Case) -> Generator[str, None, Answer]:
    """The extractive answer with `error` set (nothing the model wrote was shown)."""
    fallback = extractive(
        case.embedder, case.question, case.query, case.hits, case.sources, error=str(exc)
    )
    yield fallback.answer
    return fallback


def complete_usage(
    usage: Usage | None, messages: list[dict], text: str, backend: ChatModel
) -> Usage:
    """The server's usage when it reported one, else tiktoken counts; with a cost estimate."""
    if usage is None:
        prompt = sum(count_tiktoken(m["content"]) + 4 for m in messages)
        completion = count_tiktoken(text)
        usage = Usage(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            estimated=True,
        )
    return usage.model_copy(
        update={"cost_usd": backend.cost(usage.prompt_tokens, usage.completion_tokens)}
    )
