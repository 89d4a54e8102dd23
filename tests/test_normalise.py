"""The question as the papers write it (rag/retrieve/normalise.py, and `clean_question`'s Unicode
folding): the ordinary ways of asking about a paper (lower case, capitals, quote marks, a link
after the question, fullwidth letters, an invisible character inside the name) are answered as the
plain question is, on the seed store; and normalising changes no more than letter case, links and
quote marks."""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag.answer.question import clean_question
from rag.retrieve.normalise import normalise

PLAIN = "What is Palimpsa?"
VARIANTS = [
    "What is palimpsa?",
    "what is palimpsa",
    'What is "Palimpsa"?',
    "What is \u201cPalimpsa\u201d?",
    "What is 'Palimpsa'?",
    "What is Palimpsa? https://openreview.net/forum?id=abc123",
    "What is \uff30\uff41\uff4c\uff49\uff4d\uff50\uff53\uff41?",
    "What is Pal\u200bimpsa?",
    "What is Pal\u00adimpsa?",
    "WHAT IS PALIMPSA?",
    "What is\u00a0Palimpsa?",
]
FORMAT_CHARS = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variant_is_read_as_the_plain_question(seed_rag, variant):
    seed_rag.ensure_index()
    read = normalise(clean_question(variant), seed_rag.store)
    # As typed, but for the first letter and the question mark.
    assert read[:1].lower() + read[1:].rstrip("?") == "what is Palimpsa"


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variant_is_answered_as_the_plain_question(seed_rag, variant):
    plain, asked = seed_rag.ask(PLAIN, llm=False), seed_rag.ask(variant, llm=False)
    assert plain.outcome == "answered"
    assert asked.outcome == plain.outcome
    assert [s.paper_id for s in asked.sources if s.cited] == [
        s.paper_id for s in plain.sources if s.cited
    ]


def test_a_name_whose_repository_path_is_lower_case_is_written_as_the_paper_writes_it(seed_rag):
    """DeFacto's abstract links github.com/.../defacto: a link is no use of the word in prose."""
    seed_rag.ensure_index()
    assert normalise("how does defacto work?", seed_rag.store) == "how does DeFacto work?"


@pytest.mark.parametrize(
    "question",
    ["What is Palimpsa's main idea?", "what are palimpsa's results", "What is Palimpsa?"],
)
def test_a_question_about_a_named_paper_cites_it_however_the_name_is_inflected(seed_rag, question):
    """The possessive of a name finds its paper as the name does (it was `not_covered`)."""
    plain = seed_rag.ask(PLAIN, llm=False)
    asked = seed_rag.ask(question, llm=False)
    assert asked.outcome == "answered", asked.answer
    assert plain.sources[0].paper_id in {s.paper_id for s in asked.sources if s.cited}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(FORMAT_CHARS), st.integers(0, len(PLAIN)))
def test_no_format_character_survives_cleaning(char, at):
    assert clean_question(PLAIN[:at] + char + PLAIN[at:]) == clean_question(PLAIN)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from("what is the palimpsa lora model of codeclash bert".split())))
def test_normalising_changes_only_letter_case(seed_rag, words):
    seed_rag.ensure_index()
    question = " ".join(words) + "?"
    read = normalise(question, seed_rag.store)
    assert _words(read) == _words(question)
    assert normalise(read, seed_rag.store) == read  # once is enough


def test_every_seed_question_typed_as_written_is_left_alone(seed_rag):
    """The seed questions are written with the papers' own capitals: nothing to change."""
    import json

    from tests.conftest import REPO

    seed_rag.ensure_index()
    rows = [json.loads(line) for line in (REPO / "eval/seed_questions.jsonl").open()]
    changed = [
        r["question"]
        for r in rows
        if normalise(clean_question(r["question"]), seed_rag.store) != clean_question(r["question"])
    ]
    assert changed == []


@pytest.mark.parametrize("variant", ["WHAT IS PALIMPSA?", "what is palimpsa"])
def test_a_llamaindex_app_asking_a_variant_gets_the_plain_answer(seed_rag, variant):
    """The query engine answers from hits it retrieved itself: its question is read the same way."""
    engine = seed_rag.query_engine
    plain, asked = engine.query(PLAIN).metadata["answer"], engine.query(variant).metadata["answer"]
    assert plain.outcome == asked.outcome == "answered" and asked.question == variant
    assert [s.paper_id for s in asked.sources if s.cited] == [
        s.paper_id for s in plain.sources if s.cited
    ]


NAMED = ["Palimpsa", "CodeClash", "SPARKLING"]
WORDINGS = ["{}?", "{} ", "Tell me about {}.", "tell me about {}", "{}: what is it?", "Explain {}"]


@pytest.mark.parametrize("wording", WORDINGS)
@pytest.mark.parametrize("name", NAMED)
def test_a_method_named_alone_or_in_a_request_is_answered_from_its_paper(seed_rag, name, wording):
    """A question that is the method's name, or a request naming it, however typed: read as a name
    at a sentence's start when ML abstracts never write the word ("Palimpsa?"), and "Tell me" is no
    topic the papers lack."""
    for typed in (wording.format(name), wording.format(name).lower()):
        answer = seed_rag.ask(typed, llm=False)
        cited = [s for s in answer.sources if s.cited]
        assert answer.outcome == "answered", (typed, answer.abstained_by)
        assert name.lower() in (cited[0].title + " " + cited[0].passage).lower(), typed


@pytest.mark.parametrize(
    "question",
    ["Zorblax?", "Tell me about Zorblax.", "Tell me about the boiling point of olive oil."],
)
def test_a_name_or_request_no_paper_holds_is_still_refused(seed_rag, question):
    assert seed_rag.ask(question, llm=False).outcome == "not_covered"
