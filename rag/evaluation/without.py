"""`rag eval --without RULE`: answer rules turned off, to measure what a rule contributes (the same
questions with it on and off). The rules are the rows of the table (rag/answer/rules/__init__.py);
any of them can be named, and each is turned off through `RAG_RULES_OFF` (`Settings.rules_off`)."""

from __future__ import annotations

from collections.abc import Sequence

from rag.answer.rules import check_names
from rag.config import Settings


def without(settings: Settings, names: Sequence[str]) -> tuple[Settings, list[str]]:
    """`settings` with the named rules off, and the rules now off (in the order named, each once).
    An unknown name is an `InputError` naming the rules."""
    check_names(names, where="--without")
    off = list(dict.fromkeys([*settings.rules_off, *names]))
    return settings.model_copy(update={"rules_off": off}), off
