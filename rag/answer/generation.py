"""What the two generated answers (rag/answer/free.py, the free-form one;
rag/answer/evidence_answer.py, the evidence-first one) share: the clock that estimates how long the
model reads its prompt, the refusal test, the usage of a reply and the fallback when the LLM fails.
Apart so that neither style imports the other.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rag import prompts
from rag.answer.extractive import extractive
from rag.backends.cpu_share import MIN_SAMPLE_S, CpuSample, busy_share
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
    sessions share the engine). The rate is kept as the machine's idle rate: a measurement is
    divided by the share of the CPU the reading had (`busy_share` of the cores other processes kept
    busy meanwhile), an estimate multiplied by the share since the question came (`mark`). With
    `path` (a local model: `model_cache_dir/reading-rate.json`), the rate is kept on disk under
    `key`, so a new process (each `rag ask`) starts from this machine's own measurements, not from
    `rate` (`DEFAULT_READING_RATE`). No rate: no estimate (an endpoint)."""

    def __init__(self, rate: float | None = None, path: Path | None = None, key: str = "") -> None:
        self._path, self._key = path, key
        remembered = _remembered_rate(path, key)
        self.rate = remembered or rate
        self.measured = remembered is not None  # whether `rate` is this machine's measurement
        self._local = threading.local()  # this thread's question: its CPU sample, tokens, start

    def mark(self) -> None:
        """A question came: the machine's CPU time from here to `reading` says how busy it is."""
        self._local.since = CpuSample.now()

    def reading(self, messages: list[dict], papers: list[Source]) -> Reading:
        """The piece that says the model starts reading `messages` (the prompt of `papers`); the
        wait is timed from here."""
        local = self._local
        local.tokens = count_tiktoken(messages[-1]["content"])
        local.sample = CpuSample.now()
        local.start = time.perf_counter()
        rate = self.rate
        if rate:
            since = getattr(local, "since", None)
            rate *= busy_share(since.others_cores(local.sample) if since else None)
        return Reading(papers, round(local.tokens / rate, 1) if rate else None)

    def timed(self, pieces: Iterator[str | Usage]) -> Iterator[str | Usage]:
        """`pieces`, the wait for the first one measured (a model loading, and the answerability
        check, included: the reader waits for them too)."""
        first = True
        for piece in pieces:
            if first:
                first = False
                self._measure()
            yield piece

    def _measure(self) -> None:
        local = self._local
        start = getattr(local, "start", None)
        elapsed = time.perf_counter() - start if start is not None else 0.0
        if elapsed < MIN_SAMPLE_S:
            return  # a prompt the model had mostly read already (the same question again)
        others = local.sample.others_cores(CpuSample.now())
        rate = local.tokens / elapsed / busy_share(others)
        self.rate = (self.rate + rate) / 2 if self.measured and self.rate else rate
        self.measured = True
        _remember_rate(self._path, self._key, self.rate)


def _remembered_rate(path: Path | None, key: str) -> float | None:
    """The idle reading rate kept in `path` under `key`; None when there is none (or the file is
    unreadable: the estimate then starts from the default)."""
    if path is None:
        return None
    try:
        rate = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(rate) if isinstance(rate, int | float) and 0 < rate < 1e6 else None


def _remember_rate(path: Path | None, key: str, rate: float) -> None:
    """Keep `rate` in `path` under `key` (written whole, then renamed; a cache that cannot be
    written only costs the next process its estimate)."""
    if path is None:
        return
    try:
        rates = json.loads(path.read_text()) if path.exists() else {}
        rates = rates if isinstance(rates, dict) else {}
    except (OSError, ValueError):
        rates = {}
    rates[key] = round(rate, 2)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(rates, out)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)


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
