"""`rag eval --without RULE`: the answer rules turned off by their settings, to measure what a rule
contributes (the same questions with it on and off). The rules and their settings are the table of
rules' (rag/answer/rules/__init__.py); a rule without a setting is always on and cannot be named."""

from __future__ import annotations

from collections.abc import Sequence

from rag.answer.rules import rule, switchable
from rag.config import Settings
from rag.errors import InputError


def without(settings: Settings, names: Sequence[str]) -> tuple[Settings, list[str]]:
    """`settings` with the named rules' settings off, and the settings turned off (in the order
    named; a setting several named rules share comes once). An unknown rule, or one no setting turns
    off, is an `InputError` naming the rules that can be."""
    fields: list[str] = []
    for name in dict.fromkeys(names):
        try:
            setting = rule(name).setting
        except KeyError:
            setting = None
        if setting is None:
            raise InputError(
                f"--without {name}: no rule of that name has a setting to turn it off; the rules"
                f" that have one: {', '.join(switchable())} (docs/answers.md)"
            )
        if setting not in fields:
            fields.append(setting)
    return settings.model_copy(update=dict.fromkeys(fields, False)), fields
