"""The request checks both serving surfaces share, so that the HTTP API (`rag.serve.http`) and the
MCP tools (`rag.serve.mcp`) refuse the same values with the same one line.

A failed check raises `BadRequest`, an `InputError` naming the argument: HTTP makes it a 400
(`rag.serve.gate.engine_error`), MCP a tool error. The checks are the engine's (`check_k`,
`check_mode`, `clean_question`...), so a value the CLI refuses is refused here in the same words.
Core only (no starlette, no mcp): `rag mcp` imports it without the HTTP extra.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rag.config import check_k, check_mode
from rag.errors import InputError

__all__ = [
    "BadRequest",
    "check_paper_id",
    "check_paper_ids",
    "check_text",
    "checked",
    "one_line",
    "retrieval_options",
]

T = TypeVar("T")


class BadRequest(InputError):
    """A request argument that failed its check; `param` names the argument (HTTP's error
    `param`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def one_line(text: object, limit: int) -> str:
    """`text` on one line (white space folded), cut to `limit` characters: an error message for a
    client."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def checked(check: Callable[[Any], T], value: object, param: str) -> T:
    """`check(value)`: a check of `rag.config`, `rag.cite` or `RAG.check_question` (which raise
    `InputError`), its error raised as a `BadRequest` naming `param`."""
    try:
        return check(value)
    except InputError as exc:
        raise BadRequest(str(exc), param) from None


def retrieval_options(k: object | None, mode: object | None) -> tuple[int | None, str | None]:
    """A request's `k` (papers to retrieve) and retrieval `mode`, each checked; None (not given)
    stays None: the settings' default."""
    return (
        None if k is None else checked(check_k, k, "k"),
        None if mode is None else checked(check_mode, mode, "mode"),
    )


def check_text(value: str, name: str, what: str) -> str:
    """A query or question that is not blank (the engine's own message speaks to a person
    typing)."""
    if not value.strip():
        raise BadRequest(f"{name} is empty; pass {what}", name)
    return value


def check_paper_id(paper_id: str) -> str:
    """One paper id, stripped; blank is an error."""
    if not paper_id.strip():
        raise BadRequest("paper_id is empty; pass an id as returned by search_papers", "paper_id")
    return paper_id.strip()


def check_paper_ids(paper_ids: list[str]) -> list[str]:
    """Paper ids of which at least one is not blank (returned as given: the engine names an unknown
    one)."""
    if not [p for p in paper_ids if p.strip()]:
        raise BadRequest(
            "paper_ids is empty; pass one or more ids as returned by search_papers", "paper_ids"
        )
    return paper_ids
