"""The OpenAI shapes of `rag serve`: the request models, a chat request read as a question and its
history, and an `Answer` written back as a chat completion (its text with a plain "References:"
block, `usage`, the `rag` field) or as the server-sent-event chunks of a stream.

The routes that use them, and the stream that feeds them, are in `rag.serve.http`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from rag.markers import plain_text, reference_lines
from rag.serve.gate import ApiError
from rag.text import count_tiktoken

if TYPE_CHECKING:
    from rag.models import Answer

__all__ = [
    "ChatRequest",
    "SearchRequest",
    "Unescaper",
    "content",
    "conversation",
    "rag_field",
    "references",
    "sse",
    "usage",
]


_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


# ---- requests
# -------------------------------------------------------------------------------------


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    # a string or a list of content parts: checked by _text (a union's errors name its members)
    content: Any = None


class ChatRequest(BaseModel):
    # temperature, max_tokens...: accepted, ignored
    model_config = ConfigDict(extra="allow", strict=True)
    messages: list[_Message]
    model: str | None = None
    stream: bool = False
    k: int | None = None
    mode: str | None = None


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    query: str
    k: int | None = None
    mode: str | None = None
    # passages as stored, instruction-like sentences kept (they stay untrusted text)
    raw: bool = False


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise ApiError(
            422,
            f"{where}.content must be a string or a list of content parts",
            param=f"{where}.content",
            code="invalid_type",
        )
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind != "text":
            raise ApiError(
                400,
                f"{where}.content[{i}] is a {kind!r} part; only text is supported",
                param=f"{where}.content",
                code="unsupported_content",
            )
        if not isinstance(part.get("text"), str):
            raise ApiError(
                422,
                f"{where}.content[{i}].text must be a string",
                param=f"{where}.content",
                code="invalid_type",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _strip_references(text: str) -> str:
    """An assistant turn as history: without the References block this API appended to it."""
    head, sep, _ = text.rpartition("\n\nReferences:\n")
    return head if sep else text


def conversation(messages: list[_Message]) -> tuple[str, list[dict[str, str]], list[str]]:
    """(the question, the history before it, every message's text for the prompt count)."""
    for i, m in enumerate(messages):
        if m.role not in _ROLES:
            raise ApiError(
                400,
                f"messages.{i}.role must be one of {', '.join(_ROLES)}; got {m.role!r}",
                param=f"messages.{i}.role",
                code="invalid_value",
            )
    texts = [_text(m.content, f"messages.{i}") for i, m in enumerate(messages)]
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        raise ApiError(
            400,
            'no user message: messages must hold at least one {"role": "user", "content": '
            "<the question>}",
            param="messages",
            code="no_user_message",
        )
    last = users[-1]
    history = [
        {
            "role": m.role,
            "content": _strip_references(texts[i]) if m.role == "assistant" else texts[i],
        }
        for i, m in enumerate(messages[:last])
        if m.role in ("user", "assistant") and texts[i].strip()
    ]
    return texts[last], history, texts


# ---- responses
# ------------------------------------------------------------------------------------


def references(answer: Answer) -> str:
    """The cited sources as plain lines, "[n] Title — url", under "References:" ("" when none is
    cited)."""
    lines = reference_lines(answer)
    if not lines or lines[0] != "References:":
        return ""
    out = [lines[0]]
    for line in lines[1:]:
        if not line.startswith("["):
            break
        out.append(line)
    return "\n".join(out)


def content(answer: Answer) -> str:
    """The completion's text: the answer as plain text, then its References block."""
    refs = references(answer)
    text = plain_text(answer.answer)
    return f"{text}\n\n{refs}" if refs else text


def usage(answer: Answer, prompt_texts: list[str], content: str) -> dict[str, int]:
    """The LLM's usage when one ran; for an extractive answer, tiktoken counts of the request's
    messages and the returned text."""
    if answer.mode == "llm" and answer.usage is not None:
        u = answer.usage
        return {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens or u.prompt_tokens + u.completion_tokens,
        }
    prompt = sum(count_tiktoken(t) for t in prompt_texts)
    completion = count_tiktoken(content)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def rag_field(answer: Answer) -> dict[str, Any]:
    # The contract: `rag` holds exactly the object `rag ask --json` prints.
    return answer.model_dump(mode="json")


class Unescaper:
    """`plain_text` over pieces: an escape ("\\[") split across two pieces is still undone."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, piece: str) -> str:
        text = self.pending + piece
        trailing = len(text) - len(text.rstrip("\\"))
        cut = len(text) - 1 if trailing % 2 else len(text)
        self.pending = text[cut:]
        return plain_text(text[:cut])

    def close(self) -> str:
        text, self.pending = self.pending, ""
        return text


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: `data: ` and the JSON (or the text, e.g. "[DONE]"), then a blank
    line."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
