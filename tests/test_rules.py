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
    assert switchable() == [r.name for r in RULES]  # every rule can be turned off
    with pytest.raises(KeyError, match="the rules: retrieval"):
        rule("nope")


# ---- every rule turned off (RAG_RULES_OFF, rag eval --without) ----------------------------------
# Plumbing through the answer paths with the scripted chat model of rag/testing.py (a fake, said
# so): each rule off still gives a whole answer whose stream is its text, and a rule off stops doing
# what it does.


@pytest.mark.parametrize("name", [r.name for r in RULES])
@pytest.mark.parametrize("style", ["evidence", "free", "extractive"])
def test_any_rule_off_still_answers(seed_rag, name, style):
    from .test_evidence import _ask

    reply = (
        "EVIDENCE: 1.1\nANSWER: Palimpsa generalizes Mamba2 [1]."
        if style == "evidence"
        else "Palimpsa generalizes Mamba2 [1]."
    )
    settings = {"rules_off": [name], "answer_style": style if style != "extractive" else "evidence"}
    if style == "extractive":
        answer = seed_rag.__class__(store_dir=seed_rag.store.dir, llm="none", rules_off=[name]).ask(
            "How does Palimpsa relate to Mamba2?"
        )
        pieces = [answer.answer]
    else:
        answer, pieces, _ = _ask(seed_rag, reply, **settings)
    assert answer.outcome in ("answered", "not_stated", "not_covered")
    assert "".join(pieces).strip() == answer.answer.strip() or answer.withdrawn


def test_a_rule_off_stops_acting(seed_rag):
    from .test_evidence import _ask

    off_topic = "What is the boiling point of olive oil in a pressure cooker?"
    held, _, _ = _ask(seed_rag, "EVIDENCE: 1.1\nANSWER: It is 300 degrees [1].", question=off_topic)
    assert held.abstained_by == "retrieval"
    let_through, _, _ = _ask(
        seed_rag,
        "EVIDENCE: 1.1\nANSWER: It is 300 degrees [1].",
        question=off_topic,
        rules_off=["retrieval", "topic", "background"],
    )
    assert let_through.abstained_by not in ("retrieval", "topic", "background")
    # Without the evidence rule, a reply that names no sentence is not held back by it.
    none, _, _ = _ask(seed_rag, "EVIDENCE: NONE\nANSWER: Palimpsa generalizes Mamba2 [1].")
    assert none.abstained_by == "evidence"
    kept, _, _ = _ask(
        seed_rag, "EVIDENCE: NONE\nANSWER: Palimpsa generalizes Mamba2 [1].", rules_off=["evidence"]
    )
    assert kept.abstained_by != "evidence"
    # Without on_subject, every held-back answer is a refusal.
    refused, _, _ = _ask(seed_rag, "EVIDENCE: NONE", rules_off=["on_subject"])
    assert refused.outcome == "not_covered" and not refused.citations
    # Without the output rule, a code no source holds stays in the answer.
    code = "EVIDENCE: 1.1\nANSWER: Palimpsa generalizes Mamba2; the key is QX05ZEBRAFLUX [1]."
    unchecked = ["support", "grafted_words", "swapped_names", "example_copies"]
    filtered, _, _ = _ask(seed_rag, code, rules_off=unchecked)
    unfiltered, _, _ = _ask(seed_rag, code, rules_off=[*unchecked, "filter"])
    assert "QX05ZEBRAFLUX" not in filtered.answer and "QX05ZEBRAFLUX" in unfiltered.answer


def test_the_support_rules_off_keep_their_sentences():
    from rag.answer.rules import ALL_ON
    from rag.answer.rules.support import supported_synthesis
    from rag.models import Source

    read = [Source(n=1, paper_id="p1", title="T", score=0.5, passage="Cats purr when content.")]
    grafted = "Knowledge graph embeddings predict links because cats purr when content [1]."
    question = "How do knowledge graph embeddings predict links?"
    assert supported_synthesis(grafted, read, [1], None, question) == ""
    off = ALL_ON - {"grafted_words", "support"}
    assert supported_synthesis(grafted, read, [1], None, question, off) == grafted


@pytest.mark.parametrize(
    "question",
    [
        "Which papers are about merging or fusing trained models?",
        "which papers use reinforcement learning from human feedback?",
        "Are there papers on graph neural networks?",
    ],
)
def test_a_list_by_the_model_holds_only_papers_that_fit(seed_rag, question):
    """The list rule: whatever sentences the model names (here one from every source, as a small
    model does), the list cites no paper the extractive answer's fit test leaves out."""
    from rag.answer.rules.list_fit import fitting

    from .test_evidence import _ask

    reply = "EVIDENCE: 1.1, 2.1, 3.1, 4.1, 5.1\nANSWER: These papers fit [1][2][3][4][5]."
    answer, pieces, hits = _ask(seed_rag, reply, question=question)
    fit = {
        hits[n - 1].paper.paper_id
        for n in fitting(seed_rag._answer_embedder, question, question, hits)
    }
    cited = {s.paper_id for s in answer.sources if s.cited}
    assert cited <= fit and "".join(pieces) == answer.answer
    off, _, _ = _ask(seed_rag, reply, question=question, rules_off=["list_fit"])
    assert {s.paper_id for s in off.sources if s.cited} >= cited  # off: nothing is left out


def test_each_part_of_a_two_part_question_gets_evidence_or_is_named(seed_rag):
    """The parts rule: the model quotes a sentence for the first part only (a scripted reply); the
    answer also quotes the cited paper's sentence that answers the second part. A second part no
    cited sentence answers is named as not stated; a one-part question is left as it was."""
    from rag.answer import evidence
    from rag.prompts import UNSTATED_PART

    from .test_evidence import _ask

    question = (
        "How does CodeClash evaluate language models, and how do top models fare against human"
        " experts?"
    )
    hits = seed_rag._retrieve(question)
    first = evidence.source_sentences(hits[0].chunk.abstract)
    assert "CodeClash" in hits[0].title_and_abstract
    i = next(i for i, s in enumerate(first, 1) if "CodeClash" in s)
    reply = f"EVIDENCE: 1.{i}\nANSWER: CodeClash evaluates models in tournaments [1]."
    answer, pieces, _ = _ask(seed_rag, reply, question=question)
    assert "Top models lose every round against expert human programmers." in answer.answer
    assert "".join(pieces) == answer.answer
    off, _, _ = _ask(seed_rag, reply, question=question, rules_off=["parts"])
    assert "Top models lose every round" not in off.answer
    part = "how do honey bees find their way back to the hive?"
    unstated = question.replace("how do top models fare against human experts?", part)
    named, _, _ = _ask(seed_rag, reply, question=unstated)
    assert UNSTATED_PART.format(part=part) in named.answer
