"""The answering layer (rag/answer/respond.py) given its parts, and `AnswerStream`, what
`RAG.stream` returns.

A scripted chat backend (`rag.testing.ScriptedChat`) stands in for the LLM here, so the generated
path's structure (the empty piece first, the fallback on failure, the abstentions) is checked in
milliseconds; test_llm.py runs it against a real model server.
"""

from __future__ import annotations

import pytest

from rag.answer import question as asking
from rag.answer import respond as answering
from rag.engine import _source
from rag.errors import InputError, LLMError
from rag.models import Answer, AnswerStream
from rag.prompts import (
    ABSENT_TOPIC_ANSWER,
    ABSENT_TOPIC_LEAD,
    ABSTAIN_ANSWER,
    EXTRACTIVE_LABEL,
    FALLBACK_LABEL,
    NOT_STATED_LEAD,
    REFUSAL,
    UNWRITTEN_NAMES_ANSWER,
    UNWRITTEN_NAMES_LEAD,
)
from rag.testing import ScriptedChat as Chat

Q = "How does Palimpsa relate to Mamba2?"


def ScriptedChat(
    text: str = "Palimpsa generalises Mamba2 as a self-attention model [1].", **kwargs
) -> Chat:
    """rag.testing's scripted chat model, reporting no usage (as many servers do)."""
    return Chat(text, report_usage=False, **kwargs)


def _respond(seed_rag, llm, question: str = Q, **settings) -> AnswerStream:
    hits = seed_rag._retrieve(question)
    sources = [_source(i, h) for i, h in enumerate(hits, 1)]  # as an answer gets them
    return AnswerStream(
        answering.respond(
            seed_rag.settings.model_copy(update=settings),
            seed_rag.store,
            seed_rag._answer_embedder,
            llm,
            question,
            question,
            hits,
            sources,
        )
    )


# ---- AnswerStream --------------------------------------------------------------------------------


def test_stream_pieces_are_text_and_join_to_the_answer(seed_rag):
    # an answer, then an abstention
    for question in (Q, "What is a good recipe for chocolate cake?"):
        stream = seed_rag.stream(question)
        pieces = list(stream)
        assert pieces and all(isinstance(p, str) for p in pieces)
        assert stream.done and isinstance(stream.answer, Answer)
        assert "".join(pieces) == stream.answer.answer
        assert list(stream) == [] and stream.answer is stream.answer  # one pass; the answer stays
    assert seed_rag.stream("What is a good recipe for chocolate cake?").answer.abstained


def test_answer_reads_the_rest_of_the_stream(seed_rag):
    whole = seed_rag.ask(Q)
    assert seed_rag.stream(Q).answer == whole  # never iterated
    stream = seed_rag.stream(Q)
    assert not stream.done
    next(iter(stream))  # partly read
    assert stream.answer == whole and stream.done


def test_nothing_runs_until_read_and_errors_come_from_reading(seed_rag):
    stream = seed_rag.stream("   ")  # no error yet
    with pytest.raises(InputError, match="the question is empty"):
        list(stream)
    with pytest.raises(InputError, match="the question is empty"):
        stream.answer  # noqa: B018
    with pytest.raises(InputError, match="the question is empty"):
        seed_rag.stream("").answer  # noqa: B018


def test_a_stream_that_ends_without_an_answer_or_is_closed_says_so():
    def no_answer():
        yield "text"

    stream = AnswerStream(no_answer())  # type: ignore[arg-type]
    assert list(stream) == ["text"]
    with pytest.raises(RuntimeError, match="without an Answer"):
        stream.answer  # noqa: B018

    def endless():
        while True:
            yield "more"

    stream = AnswerStream(endless())  # type: ignore[arg-type]
    assert next(stream) == "more"
    stream.close()
    assert list(stream) == []
    with pytest.raises(RuntimeError, match="closed"):
        stream.answer  # noqa: B018


# ---- which answer --------------------------------------------------------------------------------


def test_extractive_and_retrieval_abstention_without_an_llm(seed_rag):
    pieces = list(stream := _respond(seed_rag, None))
    assert pieces == [stream.answer.answer] and stream.answer.answer.startswith(EXTRACTIVE_LABEL)
    off = _respond(seed_rag, None, "What is a good recipe for chocolate cake?")
    assert list(off) == [ABSTAIN_ANSWER]
    assert off.answer.abstained_by == "retrieval" and off.answer.mode == "extractive"
    # With an LLM the same abstention comes before the model is made, in mode "llm".
    made = []
    off = _respond(seed_rag, lambda: made.append(1), "What is a good recipe for chocolate cake?")
    assert list(off) == [ABSTAIN_ANSWER] and off.answer.mode == "llm" and not made


def test_an_extractive_answer_names_a_topic_no_paper_found_holds(seed_rag):
    """Without an LLM too (rag/answer/rules/topic.py): no seed says "spiking"; the super-resolution
    paper is on the subject of a PSNR question but writes neither "PSNR" nor "DIV2K", so its
    sentences are quoted under that statement."""
    spiking = "what's in here on training spiking neural networks?"
    off = _respond(seed_rag, None, spiking, not_stated_threshold=0.99)
    assert list(off) == [ABSENT_TOPIC_ANSWER.format(terms="“spiking”")]
    assert (
        off.answer.outcome == "not_covered"
        and off.answer.abstained_by == "topic"
        and not off.answer.citations
    )
    # the nearest papers, uncited
    assert off.answer.sources and not any(s.cited for s in off.answer.sources)
    near = _respond(
        seed_rag,
        None,
        "what PSNR does the hierarchical image tokenization super-resolution model get on DIV2K?",
    )
    lead, _, quotes = "".join(near).partition("\n")
    assert near.answer.outcome == "not_stated" and near.answer.mode == "extractive"
    assert lead == ABSENT_TOPIC_LEAD.format(terms="“PSNR” or “DIV2K”") and quotes.startswith("- ")
    assert near.answer.citations and all(c.supported for c in near.answer.citations)
    plain = _respond(seed_rag, None, spiking, topic_check=False, background_check=False)
    assert "".join(plain).startswith(EXTRACTIVE_LABEL) and plain.answer.outcome == "answered"


def test_an_extractive_answer_quotes_the_papers_that_write_the_name_asked_about(seed_rag):
    """ "How does WikiMIA measure backdoor attacks on attention heads?": the sentences closest to
    its other words are the backdoor papers', but only one retrieved paper writes WikiMIA, so its
    sentences are quoted (rag/answer/extractive.py). A name no retrieved paper writes, in a
    question long enough that the topic check leaves it to the answer (one name among many
    words): the quotes stay under a lead naming it, `not_stated`, or, off the subject, the
    refusal names it (rag/answer/rules/answer_type.py, unwritten_names)."""
    question = "How does WikiMIA measure backdoor attacks on attention heads?"
    hits = seed_rag._retrieve(question)
    writes = {h.paper.paper_id for h in hits if "WikiMIA" in h.chunk.abstract}
    # the case: one paper writes the name, others are closer otherwise
    assert writes and len(writes) < len(hits)
    named = _respond(seed_rag, None, question)
    assert "".join(named).startswith(EXTRACTIVE_LABEL) and named.answer.outcome == "answered"
    assert {s.paper_id for s in named.answer.sources if s.cited} == writes
    long = (
        "In the experiments on regret for logistic bandits with neural networks and exploration"
        " bonuses, what did the authors report for the classifier trained on CIFAR-10 images?"
    )
    near = _respond(seed_rag, None, long, not_stated_threshold=0.0)
    lead, _, quotes = "".join(near).partition("\n")
    assert lead == UNWRITTEN_NAMES_LEAD.format(terms="“CIFAR-10”") and quotes.startswith("- ")
    assert near.answer.outcome == "not_stated" and near.answer.abstained_by == "answer_names"
    assert near.answer.citations and all(c.supported for c in near.answer.citations)
    assert_quotes_name_their_paper(near.answer)
    off = _respond(seed_rag, None, long, not_stated_threshold=0.99)
    assert list(off) == [UNWRITTEN_NAMES_ANSWER.format(terms="“CIFAR-10”")]
    assert off.answer.outcome == "not_covered" and off.answer.abstained_by == "answer_names"
    plain = _respond(seed_rag, None, long, answer_type_check=False)
    assert "".join(plain).startswith(EXTRACTIVE_LABEL) and plain.answer.outcome == "answered"


def assert_quotes_name_their_paper(answer: Answer) -> None:
    """A held-back answer's quotes are the closest sentences, maybe another paper's than the one
    asked about: each names its paper, where the paper changes from the line before."""
    from rag.markers import plain_text

    titles = {s.n: s.title for s in answer.sources}
    previous = None
    for line in plain_text(answer.answer).splitlines()[1:]:
        n = int(line.rsplit("[", 1)[1].rstrip("]"))
        if n != previous:
            assert line.startswith((f"- In “{titles[n]}”: ", f"- {titles[n]}: ")), line
        previous = n


def test_held_back_quotes_name_their_paper():
    from rag.answer.outcome import attributed
    from rag.models import Source

    sources = [
        Source(n=n, paper_id=f"P{n}", title=title, score=0.5, passage="")
        for n, title in [(1, "A Paper [v2]"), (2, "Other")]
    ]
    lines = (
        "- It runs 3x faster. [2]\n- It uses 8 GPUs. [2]\n- Other: a list line. [2]\n- Ours. [1]"
    )
    assert attributed(lines, sources).splitlines() == [
        "- In “Other”: It runs 3x faster. [2]",
        "- It uses 8 GPUs. [2]",
        "- Other: a list line. [2]",
        "- In “A Paper \\[v2\\]”: Ours. [1]",
    ]
    assert attributed("- [9] is no source. [9]\n- no marker", sources) == (
        "- [9] is no source. [9]\n- no marker"
    )


def test_should_abstain_on_nothing_retrieved(seed_rag):
    assert answering.should_abstain(seed_rag.settings, seed_rag.store, Q, [])
    assert not answering.should_abstain(seed_rag.settings, seed_rag.store, Q, seed_rag._retrieve(Q))


def test_generated_answer_streams_after_an_empty_piece(seed_rag):
    chat = ScriptedChat()
    stream = _respond(seed_rag, lambda: chat)
    pieces = list(stream)
    answer = stream.answer
    assert pieces[0] == "" and len(pieces) > 2 and all(isinstance(p, str) for p in pieces)
    assert answer.mode == "llm" and not answer.abstained and answer.error is None
    assert "".join(pieces).strip() == answer.answer
    assert answer.cited_sources[0].paper_id == "wKMV7mXjUr" and answer.citations[0].n == 1
    assert answer.usage.estimated and chat.kinds == ["stream"]


def test_a_chat_model_passed_to_rag_answers_through_the_same_path(seed_store):
    from rag import RAG

    chat = ScriptedChat()
    engine = RAG(store_dir=seed_store, llm=chat)
    stream = engine.stream(Q)
    assert next(stream) == "" and stream.answer.mode == "llm" and chat.kinds == ["stream"]
    # llm=False still means extractive
    assert engine.stream(Q, llm=False).answer.mode == "extractive"


def test_follow_ups_are_rewritten_by_the_rule_unless_llm_rewrite_is_on(seed_store):
    """bench/answers/followups.py measured the small model's rewrites dropping the topic; the rule
    is the default. The scripted model rewrites every follow-up to a question about another paper.
    """
    from rag import RAG

    history = [
        {"role": "user", "content": "What is Palimpsa?"},
        {"role": "assistant", "content": "A self-attention model [1]."},
    ]
    chat = ScriptedChat(text="How can training data be shuffled for stochastic gradient descent?")
    engine = RAG(store_dir=seed_store, llm=chat, llm_check=False, llm_require_support=False)
    answer = engine.chat("and its relation to Mamba2?", history)
    assert answer.sources[0].paper_id == "wKMV7mXjUr" and "complete" not in chat.kinds
    chat.calls.clear()
    engine = RAG(
        store_dir=seed_store, llm=chat, llm_check=False, llm_require_support=False, llm_rewrite=True
    )
    answer = engine.chat("and its relation to Mamba2?", history)
    assert chat.kinds[0] == "complete" and answer.sources[0].paper_id != "wKMV7mXjUr"


def test_an_llm_that_cannot_start_becomes_the_extractive_fallback(seed_rag):
    def missing():
        raise LLMError("no local model file at x.gguf; set RAG_LOCAL_MODEL_PATH")

    stream = _respond(seed_rag, missing)
    pieces = list(stream)
    assert pieces[0] == "" and "".join(pieces) == stream.answer.answer
    assert stream.answer.mode == "extractive" and stream.answer.answer.startswith(FALLBACK_LABEL)
    assert "RAG_LOCAL_MODEL_PATH" in stream.answer.error and stream.answer.citations


def test_an_llm_failing_mid_stream_shows_only_the_fallback(seed_rag):
    stream = _respond(seed_rag, lambda: ScriptedChat(fail_after=3))
    pieces = list(stream)
    answer = stream.answer
    assert answer.mode == "extractive" and "broke off" in answer.error
    # Nothing of the broken reply was shown: the stream is the fallback answer alone.
    assert "".join(pieces) == answer.answer and pieces[-1] == answer.answer


def test_the_answerability_check_and_a_refusal_abstain(seed_rag):
    chat = ScriptedChat(yes=0.01)
    stream = _respond(seed_rag, lambda: chat, llm_check=True, answer_style="free")
    assert list(stream) == ["", ABSTAIN_ANSWER] and chat.kinds == ["check"]
    assert stream.answer.abstained_by == "check" and stream.answer.answerable == 0.01
    assert stream.answer.outcome == "not_covered"
    stream = _respond(seed_rag, lambda: ScriptedChat(text=REFUSAL), answer_style="free")
    assert "".join(stream) == ABSTAIN_ANSWER  # the answer as settled, not the model's words
    assert stream.answer.abstained_by == "model" and stream.answer.answer == ABSTAIN_ANSWER
    # Evidence answers: on a question the papers are about, both say what the papers do state
    # instead.
    for chat, by in ((ScriptedChat(yes=0.01), "check"), (ScriptedChat(text=REFUSAL), "evidence")):
        stream = _respond(seed_rag, lambda chat=chat: chat, llm_check=by == "check")
        answer = stream.answer
        assert (answer.outcome, answer.abstained, answer.abstained_by) == ("not_stated", True, by)
        assert answer.answer.startswith(NOT_STATED_LEAD) and answer.citations[0].supported


# ---- follow-ups ----------------------------------------------------------------------------------


def test_follow_ups_are_rewritten_by_the_llm_or_the_heuristic():
    history = [
        {"role": "user", "content": "What is Palimpsa?"},
        {"role": "assistant", "content": "A model [1]."},
    ]
    assert asking.rewrite("what about its results?", None, None) == "what about its results?"
    assert (
        asking.rewrite("what about its results?", history, None)
        == "What is Palimpsa? what about its results?"
    )
    long = "Which paper proposes a graph diffusion model for forecasting road traffic?"
    assert not asking.is_follow_up(long) and asking.rewrite(long, history, None) == long
    chat = ScriptedChat(text='"What are the results of Palimpsa?"\nextra line')
    assert (
        asking.rewrite("and its results?", history, lambda: chat)
        == "What are the results of Palimpsa?"
    )

    def down():
        raise LLMError("cannot connect")

    # An LLM that fails, or answers nothing usable, leaves the heuristic's question.
    assert asking.rewrite("and its results?", history, down) == "What is Palimpsa? and its results?"
    assert (
        asking.rewrite("and its results?", history, lambda: ScriptedChat(text="\x00 "))
        == "What is Palimpsa? and its results?"
    )
