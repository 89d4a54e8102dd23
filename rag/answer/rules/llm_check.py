"""The LLM check of evidence answers (`llm_check`, off by default; rag/answer/rules/__init__.py):
asked after the reply, on its cached prompt, whether the sentences it named state the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag import prompts

if TYPE_CHECKING:
    from rag.backends.chat import ChatModel


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
