"""The question: `clean_question` validates what is asked (every surface calls it before anything
else), `rewrite` turns a follow-up into a standalone question, the LLM's rewrite
(`rewrite_with_llm`) when there is one, a heuristic (`is_follow_up` and the conversation's last
standalone question) otherwise, and `asks` splits a question that asks two things into its parts.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING

from rag import prompts
from rag.config import MAX_QUESTION_CHARS
from rag.errors import InputError, RagError
from rag.text import clean_field

if TYPE_CHECKING:
    from rag.backends.chat import ChatModel

# The chat backend, made when first needed: making it may raise `LLMError` (a local model that is
# not installed), which then becomes the extractive fallback like any other failure of the LLM; and
# a local model loads while the caller shows that the model is reading the sources.
LLMGetter = Callable[[], "ChatModel"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_FOLLOW_UP = re.compile(
    r"\b(it|its|they|their|them|this|that|these|those|the paper|the method|same)\b", re.I
)


# A second ask starts with a wh-word after a comma, a semicolon, "and", "also" or "plus" ("How does
# CodeClash evaluate models, and how do top models fare?"), or is a second sentence ("... ? Does
# it ...?"); "merging and fusing" is one ask, and "Which models, and of what sizes, were found" too.
_WH = r"(?:how|what|which|why|who|whose)"  # "where"/"when" after a comma: a relative clause
_AUX = r"(?:is|are|was|were|does|do|did|can|could|will|would|should|has|have|had)"
_SECOND_ASK = re.compile(
    rf"(?:[,;]\s*(?:(?:and|also|plus)\s+)?(?={_WH}\b)"
    rf"|\s+(?:and|plus)\s+(?:also\s+)?(?={_WH}\b)"
    r"|(?<=\?)\s+(?=\S))",
    re.I,
)
_ASKS = re.compile(rf"(?:{_WH}|{_AUX})\b|.*\?$", re.I)  # a piece that asks something
MIN_ASK_WORDS = 3  # a shorter piece ("and why?") belongs to the ask before it


def asks(question: str) -> list[str]:
    """The things a question asks, in order: one for most questions, two or more for "X, and Y?",
    "what ... and how many ...?" or two sentences; each without its joining word."""
    spans: list[list[int]] = []  # [start, end] of each ask in `question`
    start = 0
    for m in [*_SECOND_ASK.finditer(question), None]:
        end, following = (m.start(), m.end()) if m else (len(question), len(question))
        if spans and len(question[start:end].split()) < MIN_ASK_WORDS:
            spans[-1][1] = end  # "..., and why?" stays with the ask before it, as written
        elif question[start:end].strip(" ,;"):
            spans.append([start, end])
        start = following
    # A piece that asks nothing ("In Persona-Invariant Alignment, what roles ...") is the context of
    # the ask after it.
    merged: list[list[int]] = []
    for span in spans:
        if merged and not _ASKS.match(question[merged[-1][0] : merged[-1][1]].strip()):
            merged[-1][1] = span[1]
        else:
            merged.append(span)
    return [question[a:b].strip(" ,;") for a, b in merged] or [question]


def clean_question(question: object) -> str:
    """Validate a question: text, not blank, not over-long; control characters become spaces."""
    if not isinstance(question, str):
        raise InputError(f"the question must be text, got {type(question).__name__}")
    text = " ".join(clean_field(question).split())
    if _SURROGATE.search(text):
        # A lone surrogate is what Python makes of bytes that are not UTF-8 (a terminal in another
        # encoding); it cannot be embedded or stored.
        raise InputError(
            "the question holds bytes that are not UTF-8 text; retype it in a UTF-8 terminal "
            "(set LANG to a UTF-8 locale, e.g. C.UTF-8)"
        )
    # Fullwidth letters as ASCII, and no invisible characters (zero-width spaces, soft hyphens,
    # direction and tag characters): "Ｐａｌ\u200bimpsa" is Palimpsa.
    text = unicodedata.normalize("NFKC", text)
    text = " ".join("".join(c for c in text if unicodedata.category(c) != "Cf").split())
    if not text:
        raise InputError("the question is empty; type a question about the indexed papers")
    if len(text) > MAX_QUESTION_CHARS:
        raise InputError(
            f"the question is {len(text)} characters long; keep it under {MAX_QUESTION_CHARS}"
        )
    return text


def rewrite(message: str, history: list[dict] | None, llm: LLMGetter | None) -> str:
    """Turn a follow-up into a standalone question (the LLM's rewrite when there is one, a heuristic
    otherwise or when the LLM fails)."""
    turns = [t for t in (history or []) if isinstance(t, dict) and t.get("content")]
    user_turns = [str(t["content"]) for t in turns if t.get("role") == "user"]
    if not user_turns:
        return message
    if llm is not None:
        try:
            return clean_question(rewrite_with_llm(llm(), message, turns) or message)
        except RagError:
            pass  # the heuristic below still gives a usable question
    if not is_follow_up(message):
        return message
    # The topic is the latest user turn that was itself a standalone question.
    topic = next((t for t in reversed(user_turns) if not is_follow_up(t)), user_turns[-1])
    return clean_question(f"{topic[: MAX_QUESTION_CHARS // 2]} {message}"[:MAX_QUESTION_CHARS])


def is_follow_up(message: str) -> bool:
    """Short, and leaning on the conversation ("what about its results?"); a long question that
    happens to say "the paper" stands on its own."""
    words = len(message.split())
    return words <= 4 or (words <= 8 and bool(_FOLLOW_UP.search(message)))


def rewrite_with_llm(llm: ChatModel, message: str, turns: list[dict]) -> str:
    """A standalone question for a follow-up, written by the LLM."""
    history = "\n".join(f"{t['role']}: {str(t['content'])[:500]}" for t in turns[-6:])
    prompt = prompts.REWRITE_PROMPT.format(history=history, message=message)
    lines = llm.complete([{"role": "user", "content": prompt}]).strip().splitlines()
    return lines[0].strip().strip('"') if lines else ""
