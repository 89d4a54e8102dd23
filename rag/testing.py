"""Stand-ins for the models (`HashEmbedder`, `ScriptedChat`), for tests of code built on `rag` (this
project's own plumbing tests too).

Like httpx's `MockTransport`: the real pipeline (chunking, Chroma, BM25, fusion, citation numbering,
streaming, the support check) runs around them and only the models are scripted, so a test can
assert on plumbing without waiting for a model; quality is asserted with the real models. Usage:
docs/python.md ("Testing an app built on rag").
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterator

from rag.backends.chat import Message
from rag.errors import LLMError
from rag.models import Usage

_WORD = re.compile(r"[a-z0-9]+")


class HashEmbedder:
    """A deterministic embedder with no model: each word and word pair of a text is hashed into one
    of `dim` buckets (signed), and the counts are scaled to a unit vector. Texts that share words
    are close, others are near-orthogonal; the same text always gives the same vector, on any
    machine. Satisfies `rag.Embedder`; an index built with it records `model_id` and refuses other
    models, as any index does."""

    def __init__(
        self, dim: int = 384, model_id: str = "test-hash-embedder", max_tokens: int = 512
    ) -> None:
        self.dim, self._model_id, self._max_tokens = dim, model_id, max_tokens
        self.calls = 0  # embed() and embed_query() calls, for tests that count model work

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_tokens(self) -> int | None:
        return self._max_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(_WORD.findall(text.lower())) + 2 for text in texts]  # + the two special tokens

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        self.calls += 1
        return [self._vector(text, truncate) for text in texts]

    def embed_query(self, text: str) -> list[float]:
        self.calls += 1
        return self._vector(text, truncate=True)

    def _vector(self, text: str, truncate: bool) -> list[float]:
        words = _WORD.findall(text.lower())
        if truncate:
            words = words[: self._max_tokens - 2]
        vec = [0.0] * self.dim
        for feature in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            vec[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vec))
        if norm == 0.0:  # no words: a fixed unit vector, so the store never holds a zero vector
            return [1.0] + [0.0] * (self.dim - 1)
        return [v / norm for v in vec]


Reply = str | Callable[[list[Message]], str]


class ScriptedChat:
    """A chat model that says what it is told: `reply` (a string, or a function of the messages) is
    streamed in word pieces, `complete` returns it whole, and the answerability check gets `yes`.
    `fail_after=n` raises `LLMError` after n pieces, as a server that breaks off mid-answer does;
    `report_usage=False` ends a stream without token counts, as servers that report none do. Every
    call is recorded in `calls` as (kind, messages), kind one of "stream", "complete", "check".
    Satisfies `rag.ChatModel`."""

    def __init__(
        self,
        reply: Reply = "The indexed papers state this [1].",
        *,
        yes: float = 0.9,
        fail_after: int | None = None,
        report_usage: bool = True,
        label: str = "scripted",
    ) -> None:
        self.reply, self.yes, self.fail_after, self._label = reply, yes, fail_after, label
        self.report_usage = report_usage
        self.calls: list[tuple[str, list[Message]]] = []

    @property
    def kinds(self) -> list[str]:
        """The kinds of the calls so far, in order."""
        return [kind for kind, _ in self.calls]

    @property
    def label(self) -> str:
        return self._label

    def check_model(self) -> None:
        pass

    def _text(self, messages: list[Message]) -> str:
        return self.reply(messages) if callable(self.reply) else self.reply

    def stream(self, messages: list[Message]) -> Iterator[str | Usage]:
        self.calls.append(("stream", messages))
        words = self._text(messages).split(" ")
        for i, word in enumerate(words):
            if self.fail_after is not None and i == self.fail_after:
                raise LLMError("the LLM stream broke off; check OPENAI_BASE_URL")
            yield word if i == 0 else " " + word
        if not self.report_usage:
            return
        prompt = sum(len(str(m.get("content", "")).split()) for m in messages)
        yield Usage(
            prompt_tokens=prompt, completion_tokens=len(words), total_tokens=prompt + len(words)
        )

    def complete(self, messages: list[Message]) -> str:
        self.calls.append(("complete", messages))
        return self._text(messages)

    def yes_probability(self, messages: list[Message]) -> float:
        self.calls.append(("check", messages))
        return self.yes

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return None
