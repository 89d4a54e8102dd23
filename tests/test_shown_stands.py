"""What is shown stands (issue 49): the pieces an answer stream yields, joined, are the final
answer's text, whatever the model replies. Over many generated replies from the scripted chat model
of rag/testing.py (a fake, said so: plumbing, not the model's words) for both answer styles: true
sentences, swapped names, invented claims, codes and links no source holds, the refusal, no
evidence, markers that match no source. Then over HTTP, whose stream is the answer and its
references, with a scripted OpenAI-compatible stub on loopback. The CLI's test is
tests/test_cli.py::test_ask_shows_only_the_checked_answer."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag import Reading, Writing
from rag.markers import plain_text
from rag.prompts import REFUSAL

from .test_evidence import _ask

QUESTIONS = [
    "How does Palimpsa relate to Mamba2?",
    "Which papers are about merging trained models?",
    "How many training steps does DoReMi save?",
    "What is the boiling point of olive oil?",
    "what is palimpsa",
]
CLAIMS = [
    "Mamba2 is a special case of Palimpsa where forgetting dominates",
    "Palimpsa is a special case of Palimpsa where forgetting dominates",
    "The method reaches 99% accuracy on ImageNet",
    "The key is QX05ZEBRAFLUX, see http://203.0.113.9/login",
    "Palimpsa uses Bayesian metaplasticity",
    REFUSAL.rstrip("."),
    "",
]
MARKERS = ["[1]", "[2]", "[1, 2]", "[9]", ""]


@st.composite
def replies(draw, style: str) -> str:
    sentences = [
        f"{draw(st.sampled_from(CLAIMS))} {draw(st.sampled_from(MARKERS))}".strip() + "."
        for _ in range(draw(st.integers(0, 3)))
    ]
    synthesis = " ".join(sentences)
    if style == "free":
        return synthesis
    picked = draw(st.sampled_from(["1.1", "1.2, 2.1", "3.4", "NONE", "9.9", "1.1, 1.1", "x.y", ""]))
    return f"EVIDENCE: {picked}\nANSWER: {synthesis}"


PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("style", ["evidence", "free"])
def test_the_stream_is_the_answer(seed_rag, style):
    @PROPERTY
    @given(st.sampled_from(QUESTIONS), replies(style))
    def check(question, reply):
        answer, pieces, _ = _ask(seed_rag, reply, question=question, answer_style=style)
        assert "".join(pieces) == answer.answer
        # Status pieces come before the text, and no piece of text is ever empty or taken back:
        # the whole answer at once, or the quotes (once the evidence line is read), then the rest.
        text = [p for p in pieces if p]
        assert 1 <= len(text) <= 2
        assert all(isinstance(p, (Reading, Writing)) for p in pieces if not p)
        if len(text) == 2:
            assert all(line.startswith("- ") for line in text[0].splitlines())
            assert text[1].startswith("\n\n")

    check()


def test_the_papers_are_shown_before_the_model_writes(seed_rag):
    reply = "EVIDENCE: 1.1\nANSWER: Palimpsa uses Bayesian metaplasticity [1]."
    answer, pieces, hits = _ask(seed_rag, reply)
    reading = pieces[0]
    assert isinstance(reading, Reading) and reading.sources == len(reading.papers) > 0
    found = [p.paper_id for p in reading.papers]
    assert found == [h.paper.paper_id for h in hits][: len(found)]
    assert isinstance(pieces[1], Writing) and pieces[1].tokens == 1
    assert answer.outcome == "answered" and "".join(pieces) == answer.answer
    # the quote as soon as the evidence line is read, before the synthesis is written
    quote, synthesis = (p for p in pieces if p)
    assert plain_text(quote).startswith("- ") and "Bayesian metaplasticity" in synthesis


def test_the_http_stream_is_the_answer(seed_store, tmp_path):
    """A synthesis the check drops (the README's swapped subject) never reaches an HTTP client."""
    from tests.harness import stop_process
    from tests.obedient_server import ObedientServer
    from tests.test_server import start_api

    reply = (
        "EVIDENCE: 1.1\nANSWER: Palimpsa is a special case of Palimpsa where forgetting"
        " dominates [1]."
    )
    with ObedientServer(reply=reply) as stub:
        env = {
            "RAG_LLM": "openai",
            "OPENAI_BASE_URL": stub.base_url,
            "RAG_LLM_MODEL": stub.model,
            "OPENAI_API_KEY": "sk-test",
        }
        server = start_api(seed_store, tmp_path, env)
        try:
            chunks = list(
                server.client().chat.completions.create(
                    model="rag",
                    stream=True,
                    messages=[{"role": "user", "content": "How does Palimpsa relate to Mamba2?"}],
                )
            )
        finally:
            stop_process(server.proc)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = chunks[-1].model_extra["rag"]["answer"]
    assert "Palimpsa is a special case" not in content
    assert content.partition("\n\nReferences:")[0].strip() == plain_text(answer).strip()


def test_quotes_shown_stand_when_the_model_breaks_off(seed_rag):
    """The model fails after naming its sentences (a scripted model, a fake: the failure is the
    plumbing under test): the quotes already shown are the answer, with the error, not an
    extractive answer that would contradict them."""
    reply = "EVIDENCE: 1.1\nANSWER: Palimpsa uses Bayesian metaplasticity [1]."
    answer, pieces, _ = _ask(seed_rag, reply, fail_after=4)
    text = [p for p in pieces if p]
    assert len(text) == 1 and plain_text(text[0]).startswith("- ")
    assert answer.answer == text[0] and answer.mode == "llm" and answer.outcome == "answered"
    assert answer.error and answer.sources[0].cited
