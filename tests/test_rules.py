"""The table of rules (rag/answer/rules/__init__.py) against what it describes: every `abstained_by`
label is some row's, every row is in docs/answers.md (written from the table), and every setting,
threshold, function and docs anchor a row names exists."""

from __future__ import annotations

import importlib
import importlib.util
import re
from typing import get_args

import pytest

from rag.answer.rules import CHECKS, GATES, RULES, rule, switchable
from rag.config import Settings
from rag.models import AbstainedBy, Answer
from tests.conftest import REPO

DOCS = REPO / "docs"


def test_every_label_is_a_rule_and_every_rule_label_a_label():
    labels = set(get_args(AbstainedBy))
    assert labels == {r.label for r in RULES if r.label}, "a label no row sets, or the reverse"
    assert Answer.model_fields["abstained_by"].annotation == AbstainedBy | None


def test_rows_are_unique_and_gates_come_first():
    assert len({r.name for r in RULES}) == len(RULES)
    assert RULES[: len(GATES)] == GATES and RULES[len(GATES) :] == CHECKS
    assert [r.name for r in GATES] == ["retrieval", "topic", "background"]


def test_every_row_is_in_the_docs_table():
    page = (DOCS / "answers.md").read_text(encoding="utf-8")
    for r in RULES:
        assert f"[`{r.name}`]({r.doc_anchor})" in page, f"docs/answers.md lacks the rule {r.name}"


def _anchors(path) -> set[str]:
    out = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("r", RULES, ids=lambda r: r.name)
def test_what_a_row_names_exists(r):
    fields = Settings.model_fields
    if r.setting:
        assert fields[r.setting].annotation is bool, r.setting
    for t in r.thresholds:
        if t[0].isdigit():  # a constant written in the rule's code ("2 words")
            continue
        if "." in t:
            module, name = t.split(".")
            where = [f"rag.answer.rules.{module}", f"rag.answer.{module}"]
            found = [m for m in where if importlib.util.find_spec(m)]
            assert found and hasattr(importlib.import_module(found[0]), name), t
        else:
            assert t in fields, t
    module, name = r.where.split(":")
    assert hasattr(importlib.import_module(module), name), r.where
    page, _, anchor = r.doc_anchor.partition("#")
    assert anchor in _anchors(DOCS / (page or "answers.md")), r.doc_anchor
    assert set(r.applies_to) & {"extractive", "evidence", "free"}
    assert set(r.applies_to) & {"lists", "single"}


def test_rules_by_name():
    assert rule("topic").setting == "topic_check"
    assert "topic" in switchable() and "support" not in switchable()
    with pytest.raises(KeyError, match="the rules: retrieval"):
        rule("nope")
