"""Evidence-first answers (rag/answer/evidence.py, `generated_evidence` in
rag/answer/evidence_answer.py) and outcomes.

A scripted chat backend (`ScriptedChat` of test_answer.py, the product's `ChatModel` seam) stands in
for the LLM: these tests check the plumbing (what the prompt shows, how the reply is read, how
quotes, lists and "not stated" answers are built, what the support check drops) on the real seed
store and embedder. What the local model makes of the prompt is measured by bench/answers/quality.py
and checked in test_local_model.py.
"""

from __future__ import annotations

import json
import re

import pytest

from rag.answer import evidence
from rag.answer import respond as answering
from rag.answer.citations import parse_markers, plain_text
from rag.answer.rules.answer_type import gives_asked_type
from rag.answer.rules.premise import premise
from rag.answer.rules.support import grafted_words, swapped_names
from rag.engine import _source
from rag.models import AnswerStream
from rag.prompts import (
    ABSENT_TOPIC_ANSWER,
    ABSENT_TOPIC_LEAD,
    ABSTAIN_ANSWER,
    NOT_STATED_LEAD,
    UNWRITTEN_NAMES_LEAD,
)

from .test_answer import Q, ScriptedChat, assert_quotes_name_their_paper


def _ask(seed_rag, reply: str, question: str = Q, fail_after: int | None = None, **settings):
    settings = {"llm_check": False, **settings}
    hits = seed_rag._retrieve(question)
    sources = [_source(i, h) for i, h in enumerate(hits, 1)]  # as an answer gets them
    chat = ScriptedChat(reply, fail_after=fail_after)
    stream = AnswerStream(
        answering.respond(
            seed_rag.settings.model_copy(update=settings),
            seed_rag.store,
            seed_rag._answer_embedder,
            lambda: chat,
            question,
            question,
            hits,
            sources,
        )
    )
    pieces = list(stream)
    return stream.answer, pieces, hits


def _sentences(hit) -> list[str]:
    return evidence.source_sentences(hit.chunk.abstract)


# ---- reading the reply ---------------------------------------------------------------------------


def _feed(parser: evidence.ReplyParser, pieces: list[str]) -> str:
    return "".join(parser.feed(p) for p in pieces) + parser.close()


def test_the_reply_parser_reads_evidence_then_streams_the_synthesis():
    shown = [
        evidence.ShownSource(1, "A", ["a one.", "a two.", "a three."]),
        evidence.ShownSource(2, "B", ["b one."]),
    ]
    parser = evidence.ReplyParser(2, shown)
    assert parser.feed("EVID") == "" and parser.feed("ENCE: 1.3, 2.1, 9.9, 1.7\nANS") == ""
    assert _feed(parser, ["WER: It does X [1", ".2] and Y [2]."]) == "It does X [1] and Y [2]."
    # Sentence markers name evidence too; numbers that point at nothing shown are ignored.
    assert parser.evidence == [(1, 3), (2, 1), (1, 2)] and not parser.none
    assert parser.quotes() == [(1, "a three."), (2, "b one."), (1, "a two.")]


def test_the_reply_parser_takes_none_and_replies_without_labels():
    shown = [evidence.ShownSource(1, "A", ["a one."])]
    none = evidence.ReplyParser(1, shown)
    none.feed("**Evidence**: NONE\nANSWER: The indexed")
    assert none.decided and none.none and none.evidence == []
    free = evidence.ReplyParser(1, shown)
    # No label: the reply is the synthesis from its first piece on (streamed, not held to the end).
    assert free.feed("Palimpsa") == "Palimpsa" and _feed(free, [" is X [1]."]) == " is X [1]."
    assert free.evidence == [] and not free.none


@pytest.mark.parametrize(
    "question, expected",
    [
        ("Which papers use DPO as part of their method?", True),
        ("what work studies heterogeneous tables?", True),
        ("Are there any papers on diffusion language models?", True),
        ("is there a paper that attacks LLM watermarks?", True),
        ("How does Palimpsa relate to Mamba2?", False),
        ("What speedup does the method report?", False),
        ("Which layer does the attack target?", False),
        ("any papers on gaussian splatting or NeRF?", True),
        ("anything on speech recognition for low-resource languages?", True),
        ("what's in here on training spiking neural networks?", True),
        ("vision-language-action models for robot manipulation, any papers?", True),
        ("looking for work on learning with noisy labels", True),
        ("looking for the paper that turns reasoning traces into graphs", False),
        ("is there a benchmark for how safe chatbots are on science questions?", False),
    ],
)
def test_which_papers_questions_are_told_apart(question, expected):
    assert evidence.is_list_question(question) is expected


def test_the_best_source_is_shown_whole_and_the_others_trimmed(seed_rag):
    hits = seed_rag._retrieve(Q)
    abstracts = [_sentences(h) for h in hits]
    chosen = evidence.choose_sentences(
        Q, abstracts, 10**6, 60, lambda t: seed_rag._answer_embedder.embed(t, truncate=True)
    )
    assert chosen[0] == abstracts[0]
    for full, kept in zip(abstracts[1:], chosen[1:]):
        assert kept and set(kept) <= set(full)
        # abstract order
        assert [full.index(s) for s in kept] == sorted(full.index(s) for s in kept)
        assert len(kept) < len(full) or sum(len(s) for s in full) < 400


# ---- answers -------------------------------------------------------------------------------------


def test_an_evidence_answer_quotes_the_named_sentences_exactly(seed_rag):
    probe, _, hits = _ask(seed_rag, "EVIDENCE: NONE")  # the sentences the model is shown
    first = _sentences(hits[0])
    assert "Palimpsa" in first[2] and "Mamba2 is a special case" in first[4]
    answer, pieces, _ = _ask(
        seed_rag,
        "EVIDENCE: 1.3, 1.5\nANSWER: Palimpsa views in-context learning as a continual "
        "learning problem, and Mamba2 is a special case of it where forgetting dominates [1.5].",
    )
    assert answer.outcome == "answered" and not answer.abstained
    assert pieces[0] == "" and "".join(pieces) == answer.answer
    text = plain_text(answer.answer)
    assert first[2] in text and first[4] in text  # verbatim
    # the quotes first, as soon as the evidence line is read (a piece of their own), then the
    # synthesis
    quoted = [p for p in pieces if p.strip()]
    assert len(quoted) == 2 and first[2] in plain_text(quoted[0]) and first[4] in quoted[0]
    assert "continual learning problem, and" in quoted[1]
    assert text.index(first[2]) < text.index("continual learning problem, and")
    assert set(parse_markers(answer.answer)) == {1} and answer.sources[0].cited
    assert answer.sources[0].paper_id == hits[0].paper.paper_id
    # the named sentences, each with its neighbour closest to the question when that is another
    evidence = answer.sources[0].evidence
    assert first[2] in evidence and first[4] in evidence and len(evidence) <= 4
    assert all(s in first[1:6] for s in evidence)
    assert all(c.supported for c in answer.citations)
    assert probe.outcome in {"not_stated", "not_covered"}


def _bag_of_words(texts):
    """A bag-of-words stand-in for the embedder (a fake, for plumbing tests): enough to tell short
    sentences apart."""
    import numpy as np

    vocab = sorted({w for t in texts for w in t.lower().split()})
    rows = np.array([[t.lower().split().count(w) for w in vocab] for t in texts], dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_a_model_that_names_every_sentence_gets_the_closest_quoted():
    """Property, over random picks and caps: with `most`, the quotes are at most `most` of those
    chosen without it, in the same order; the papers the synthesis cites come first, and among a
    paper's sentences the one its claim says is kept. (The local model named all of CodeClash's
    nine sentences, setup first; the four quoted left "Top models lose every round" out.)"""
    import random

    shown = [
        evidence.ShownSource(
            1,
            "A",
            [
                "Benchmarks evaluate models on tasks.",
                "Open objectives remain a challenge.",
                "Models compete in tournaments of code.",
                "Each round has two parts.",
                "Top models lose every round against human experts.",
            ],
        ),
        evidence.ShownSource(2, "B", ["Language models perform well on benchmarks."]),
    ]
    synthesis = "Top models lose every round against human experts [1]."
    rng = random.Random(1)
    pool = [(1, i) for i in range(1, 6)] + [(2, 1)]
    for _ in range(50):
        picked = rng.sample(pool, k=rng.randint(2, len(pool)))
        free = evidence.settle_evidence(picked, shown, synthesis, "q", False, _bag_of_words)
        most = rng.randint(1, 4)
        capped = evidence.settle_evidence(picked, shown, synthesis, "q", False, _bag_of_words, most)
        assert len(capped) <= most and capped == [p for p in free if p in capped]
        if len(free) > most:
            assert len(capped) == most and all(n == 1 for n, _ in capped)
            assert (1, 5) in capped or (1, 5) not in free


def test_a_pick_next_to_the_sentence_meant_moves_to_it():
    shown = [
        evidence.ShownSource(
            1,
            "A",
            [
                "Transformers are widely used.",
                "Our model cuts memory use by half.",
                "We release code.",
            ],
        ),
        evidence.ShownSource(
            2, "B", ["Graphs are everywhere.", "The method forecasts traffic on road networks."]
        ),
    ]

    def embed(texts):  # a bag-of-words embedder: enough to tell these sentences apart
        import numpy as np

        vocab = sorted({w for t in texts for w in t.lower().split()})
        rows = np.array(
            [[t.lower().split().count(w) for w in vocab] for t in texts], dtype=np.float32
        )
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    synthesis = "The model cuts memory use by half [1]. It forecasts traffic on road networks [2]."
    # 1.3 is next to 1.2, which the synthesis says; source 2 is cited without a pick.
    assert evidence.settle_evidence(
        [(1, 3)], shown, synthesis, "how much memory?", False, embed
    ) == [(1, 2), (2, 2)]
    # A pick far from the sentence meant is kept: only neighbours move.
    assert evidence.settle_evidence(
        [(1, 1)], shown, "It is widely used [1].", "q", False, embed
    ) == [(1, 1)]
    # Which papers: one sentence per paper, the one closest to the question.
    assert evidence.settle_evidence(
        [(1, 1), (1, 3), (2, 1)],
        shown,
        "",
        "which papers forecast traffic or cut memory use?",
        True,
        embed,
    ) == [(1, 2), (2, 2)]


def test_an_unsupported_synthesis_sentence_is_dropped_and_the_quotes_stay(seed_rag):
    first = _sentences(seed_rag._retrieve(Q)[0])
    answer, _, _ = _ask(
        seed_rag, "EVIDENCE: 1.3\nANSWER: Palimpsa was trained on 512 TPUs for three weeks [1]."
    )
    assert answer.outcome == "answered"
    assert "TPU" not in answer.answer and "three weeks" not in answer.answer
    # What stays is the quote: the pick, with its neighbour closest to the question when that is
    # another (no synthesis tells which the model meant).
    lines = plain_text(answer.answer).strip().splitlines()
    assert f"- {first[2]} [1]" in lines and len(lines) <= 2
    assert all(line in {f"- {s} [1]" for s in first[1:4]} for line in lines)


def test_no_sentence_on_the_subject_is_not_stated_with_the_closest_sentence_quoted(seed_rag):
    question = "Which optimizer and learning rate was Palimpsa trained with?"
    answer, pieces, hits = _ask(
        seed_rag,
        "EVIDENCE: NONE\nANSWER: The indexed papers don't answer this question.",
        question=question,
    )
    assert answer.outcome == "not_stated" and answer.abstained
    assert answer.answer.startswith(NOT_STATED_LEAD) and "".join(pieces) == answer.answer
    assert_quotes_name_their_paper(answer)
    quoted = answer.sources[0]
    assert (
        quoted.cited
        and quoted.evidence
        and quoted.evidence[0] in " ".join(_sentences(hits[0]) + _sentences(hits[1]))
    )
    assert all(c.supported for c in answer.citations)
    data = json.loads(answer.to_json())
    assert data["outcome"] == "not_stated" and data["abstained"] is True


def test_a_number_or_names_question_answered_without_one_is_not_stated(seed_rag):
    """The model names a true sentence that does not hold what was asked
    (rag/answer/rules/answer_type.py)."""
    question = "How many times faster than Mamba2 is Palimpsa?"
    sentences = _sentences(seed_rag._retrieve(question)[0])
    plain = next(
        i for i, s in enumerate(sentences, 1) if not any(c.isdigit() for c in s) and "Palimpsa" in s
    )
    reply = f"EVIDENCE: 1.{plain}\nANSWER: Palimpsa is much faster than Mamba2 [1]."
    answer, pieces, _ = _ask(seed_rag, reply, question=question)
    assert answer.outcome == "not_stated" and answer.abstained_by == "answer_type"
    assert NOT_STATED_LEAD in "".join(pieces) and answer.answer.startswith(NOT_STATED_LEAD)
    assert all(c.supported for c in answer.citations)
    unchecked, _, _ = _ask(seed_rag, reply, question=question, answer_type_check=False)
    assert (
        unchecked.outcome == "answered"
        and NOT_STATED_LEAD not in unchecked.answer
        and unchecked.citations
    )
    # Names: whichever sentence the model names (the pick may move to a neighbour), the answer holds
    # a name the question did not, or it is not stated; both happen over this abstract's sentences.
    question = "Which benchmarks was Palimpsa evaluated on?"
    outcomes = set()
    for i in range(1, len(_sentences(seed_rag._retrieve(question)[0])) + 1):
        answer, _, _ = _ask(
            seed_rag, f"EVIDENCE: 1.{i}\nANSWER: On several benchmarks [1].", question=question
        )
        outcomes.add(answer.outcome)
        if answer.outcome == "answered":
            assert gives_asked_type(question, answer.answer), answer.answer
        else:
            assert answer.outcome == "not_stated" and answer.abstained_by == "answer_type", answer
        if outcomes == {"answered", "not_stated"}:
            # both seen: the rest of the abstract would only repeat them (each pick is a whole
            # answer)
            break
    assert outcomes == {"answered", "not_stated"}


def test_a_name_that_only_defines_the_papers_own_method_is_no_answer_to_a_names_question(seed_rag):
    """ "What base LLM was CAMP fine-tuned from?" answered with the sentence that introduces
    "Conflict-Aware Adaptive Margin Preference Alignment (CAMP)": the capitalised words define the
    question's own CAMP, so they name the paper asked about, not its base model
    (rag/answer/rules/answer_type.py)."""
    question = "what base LLM was CAMP fine-tuned from in their experiments?"
    hits = seed_rag._retrieve(question)
    n, i = next(
        (n, i)
        for n, h in enumerate(hits, 1)
        for i, s in enumerate(_sentences(h), 1)
        if "(CAMP)" in s
    )
    reply = (
        f"EVIDENCE: {n}.{i}\nANSWER: CAMP is Conflict-Aware Adaptive Margin Preference Alignment"
        f" [{n}]."
    )
    answer, _, _ = _ask(seed_rag, reply, question=question)
    assert answer.outcome == "not_stated" and answer.abstained_by == "answer_type", answer.answer
    assert all(c.supported for c in answer.citations)
    unchecked, _, _ = _ask(seed_rag, reply, question=question, answer_type_check=False)
    assert unchecked.outcome == "answered" and "Conflict-Aware" in unchecked.answer


def test_a_name_from_a_sentence_outside_the_retrieved_chunk_is_written_not_cut(seed_rag):
    """The model reads the best paper's whole abstract; the output rule lets through names with
    digits or inner capitals ("DINOv3") only from what relates to the question. It judged the
    retrieved chunk alone, so a name from the abstract's other chunk was cut from the answer as "…"
    (rag/answer/injection.py, allowed_codes)."""
    question = (
        "the distributional view / KL-minimal paper for visual mech interp - what vision model did"
        " they show it on?"
    )
    hits = seed_rag._retrieve(question)
    i = next(i for i, s in enumerate(_sentences(hits[0]), 1) if "DINOv3" in s)
    # the case: the sentence is in the abstract's other chunk
    assert "DINOv3" not in hits[0].chunk.text
    answer, pieces, _ = _ask(
        seed_rag,
        f"EVIDENCE: 1.{i}\nANSWER: They show it on the DINOv3 vision model [1].",
        question=question,
    )
    assert answer.outcome == "answered" and "DINOv3 vision model [1]" in answer.answer, (
        answer.answer
    )
    assert "…" not in answer.answer and "DINOv3" in "".join(pieces)


def test_a_number_taken_from_another_paper_than_the_one_asked_about_is_not_stated(seed_rag):
    """The question is about one paper (its words match it best); the model answers with another
    paper's figure: not stated, quoting the paper asked about (rag/answer/rules/answer_type.py,
    from_another_paper)."""
    question = "training with honeypots: by how much did the rate of harmful failures drop?"
    hits = seed_rag._retrieve(question)
    best = max(h.keyword for h in hits)
    asked = next(n for n, h in enumerate(hits, 1) if h.keyword == best)
    other, i = next(
        (n, i)
        for n, h in enumerate(hits, 1)
        if h.keyword < best / 2
        for i, s in enumerate(_sentences(h), 1)
        if any(c.isdigit() for c in s)
    )
    reply = f"EVIDENCE: {other}.{i}\nANSWER: The rate dropped sharply [{other}]."
    answer, pieces, _ = _ask(seed_rag, reply, question=question)
    assert answer.outcome == "not_stated" and answer.abstained_by == "answer_source", answer
    assert answer.answer.startswith(NOT_STATED_LEAD) and NOT_STATED_LEAD in "".join(pieces)
    assert [s.paper_id for s in answer.sources if s.cited] == [hits[asked - 1].paper.paper_id]
    unchecked, _, _ = _ask(
        seed_rag, reply, question=question, answer_type_check=False, rules_off=["first_paper"]
    )
    assert unchecked.outcome == "answered" and hits[other - 1].paper.paper_id in {
        c.paper_id for c in unchecked.citations
    }


@pytest.mark.parametrize("cited", [[2], [3], [2, 4], [1], [1, 3], [3, 1]])
def test_an_answer_citing_none_of_the_first_paper_is_not_stated_naming_it(seed_rag, cited):
    """The first-paper rule (rag/answer/rules/first_paper.py): a single answer whose quotes and
    claims cite none of the paper retrieval ranked first is held back, quoting that paper under its
    title; one that cites it stands. What is shown is the final answer either way."""
    question = "How does training with honeypots make harmful failures less likely?"
    reply = (
        "EVIDENCE: "
        + ", ".join(f"{n}.1" for n in cited)
        + "\nANSWER: "
        + " ".join(f"The paper says so [{n}]." for n in cited)
    )
    answer, pieces, hits = _ask(seed_rag, reply, question=question)
    assert "".join(p for p in pieces if isinstance(p, str)) == answer.answer
    first = hits[0].paper
    if 1 in cited:
        assert answer.abstained_by != "first_paper", answer.answer
        return
    assert answer.outcome == "not_stated" and answer.abstained_by == "first_paper", answer.answer
    assert answer.answer.startswith(NOT_STATED_LEAD) and f"In “{first.title}”" in answer.answer
    assert [s.paper_id for s in answer.sources if s.cited] == [first.paper_id]
    off, _, _ = _ask(seed_rag, reply, question=question, rules_off=["first_paper"])
    assert off.abstained_by != "first_paper"


@pytest.mark.parametrize(
    "question",
    [
        "How does training with honeypots make harmful failures less likely?",
        "what reward does DeFacto use for evidence selection?",
        "what is CYBERTEAM and how many tasks does it integrate?",
        "How does Palimpsa compare with DeFacto?",
    ],
)
def test_a_single_answer_quotes_beside_the_first_paper_only_papers_as_close(seed_rag, question):
    """The first-paper rule's other half: an answer citing the first paper keeps another paper's
    quote only when that paper is at least as close to the question (its retrieval cosine) or
    holds a rare name of the question (Hit.named); the rest are not shown. Off, every quoted paper
    stays. By property, for replies quoting every paper found."""
    hits = seed_rag._retrieve(question)
    n_papers = min(len(hits), 4)
    reply = "EVIDENCE: " + ", ".join(f"{n}.1" for n in range(1, n_papers + 1)) + "\nANSWER: "
    answer, pieces, hits = _ask(seed_rag, reply, question=question)
    assert "".join(p for p in pieces if isinstance(p, str)) == answer.answer
    if answer.outcome != "answered":
        return  # another rule held the answer back: nothing of the other papers is shown
    first, by_id = hits[0], {h.paper.paper_id: h for h in hits}
    cited = [s.paper_id for s in answer.sources if s.cited]
    assert first.paper.paper_id in cited, answer.answer
    for hit in (by_id[paper_id] for paper_id in cited[1:]):
        assert hit.cosine >= first.cosine or hit.named, (hit.paper.title, answer.answer)
    off, _, _ = _ask(seed_rag, reply, question=question, rules_off=["first_paper"])
    quoted_off = {s.paper_id for s in off.sources if s.cited}
    assert set(cited) <= quoted_off
    # Every paper of the reply is quoted with the rule off; with it, those further from the
    # question than the first and holding no rare name of it are not.
    further = {h.paper.paper_id for h in hits[:n_papers] if h.cosine < first.cosine and not h.named}
    assert quoted_off - set(cited) == further & quoted_off


@pytest.mark.parametrize(
    "question",
    [
        "How does training with honeypots make harmful failures less likely?",
        "what reward does DeFacto use for evidence selection?",
        "What is Palimpsa?",
    ],
)
def test_a_single_answer_quotes_the_paper_not_its_premise(seed_rag, question):
    """The premise rule: of an abstract's sentences before it says what the paper does ("we",
    "our", "this paper"), none is quoted beside another sentence of the paper; named alone, the
    paper is quoted by its sentence past the premise closest to the question instead. Off, the
    premise is quoted. What is shown is the final answer."""
    hits = seed_rag._retrieve(question)
    sentences = _sentences(hits[0])
    turn = next(i for i, s in enumerate(sentences, 1) if re.search(r"\b(we|our)\b", s, re.I))
    assert turn > 1, sentences[0]  # the case: the abstract opens with its premise
    assert premise(hits[0].chunk.abstract) == set(sentences[: turn - 1])
    both = f"EVIDENCE: 1.1, 1.{turn + 1}\nANSWER: "
    answer, pieces, _ = _ask(seed_rag, both, question=question)
    assert "".join(p for p in pieces if isinstance(p, str)) == answer.answer
    assert answer.outcome == "answered", answer.answer
    assert sentences[turn] in answer.answer and sentences[0] not in answer.answer
    off, _, _ = _ask(seed_rag, both, question=question, rules_off=["premise"])
    assert sentences[0] in off.answer
    for named in range(1, turn):  # each premise sentence, named alone
        alone, pieces, _ = _ask(seed_rag, f"EVIDENCE: 1.{named}\nANSWER: ", question=question)
        assert "".join(p for p in pieces if isinstance(p, str)) == alone.answer
        if alone.outcome == "answered":
            assert not any(s in alone.answer for s in sentences[: turn - 1]), alone.answer
            assert any(s in alone.answer for s in sentences[turn - 1 :]), alone.answer
        off, _, _ = _ask(
            seed_rag, f"EVIDENCE: 1.{named}\nANSWER: ", question=question, rules_off=["premise"]
        )
        assert off.outcome != "answered" or sentences[named - 1] in off.answer


@pytest.mark.parametrize(
    "question",
    [
        "How does training with honeypots make harmful failures less likely?",
        "what reward does DeFacto use for evidence selection?",
        "What is Palimpsa?",
    ],
)
def test_a_quoted_turn_sentence_is_quoted_with_the_sentence_after_it(seed_rag, question):
    """The premise rule's turn: the sentence where an abstract turns to the paper ("We propose X")
    names its idea; the sentence after it, most often how, is quoted with it, once, right after
    it. What is shown is the final answer."""
    hits = seed_rag._retrieve(question)
    sentences = _sentences(hits[0])
    turn = len(premise(hits[0].chunk.abstract)) + 1  # 1-based, as the model names it
    assert turn < len(sentences), sentences  # the case: a sentence follows the turn
    answered = 0
    for reply in (f"EVIDENCE: 1.{turn}\nANSWER: ", f"EVIDENCE: 1.{turn}, 1.{turn + 1}\nANSWER: "):
        answer, pieces, _ = _ask(seed_rag, reply, question=question)
        assert "".join(p for p in pieces if isinstance(p, str)) == answer.answer
        if answer.outcome != "answered":
            continue
        answered += 1
        at, after = answer.answer.find(sentences[turn - 1]), answer.answer.find(sentences[turn])
        assert 0 <= at < after and answer.answer.count(sentences[turn]) == 1, answer.answer
    assert answered, question


def test_an_answer_citing_only_papers_that_never_name_what_was_asked_is_not_stated(seed_rag):
    """The question names DeFacto, which a retrieved paper writes (so the topic check lets it
    through); the model answers from another paper, which never mentions it: not stated, naming
    it, quoting what the model picked (rag/answer/rules/answer_type.py, unwritten_names). Citing
    the paper that writes the name is an answer."""
    question = "How does DeFacto make multimodal reasoning rely on the right visual evidence?"
    hits = seed_rag._retrieve(question)
    writes = [
        n for n, h in enumerate(hits, 1) if "DeFacto" in f"{h.paper.title} {h.chunk.abstract}"
    ]
    other = next(n for n, h in enumerate(hits, 1) if n not in writes)
    assert writes, [h.paper.title for h in hits]  # the case: a retrieved paper writes the name
    reply = f"EVIDENCE: {other}.1\nANSWER: It grounds its reasoning in evidence [{other}]."
    answer, pieces, _ = _ask(seed_rag, reply, question=question, not_stated_threshold=0.0)
    assert answer.outcome == "not_stated" and answer.abstained_by == "answer_names", answer.answer
    assert answer.answer.startswith(UNWRITTEN_NAMES_LEAD.format(terms="“DeFacto”"))
    assert [s.paper_id for s in answer.sources if s.cited] == [hits[other - 1].paper.paper_id]
    assert UNWRITTEN_NAMES_LEAD.format(terms="“DeFacto”") in "".join(pieces)
    # Off with the answer-type rules; and citing the paper that writes the name answers
    unchecked, _, _ = _ask(
        seed_rag, reply, question=question, answer_type_check=False, rules_off=["first_paper"]
    )
    assert unchecked.outcome == "answered"
    n = writes[0]
    i = next(i for i, s in enumerate(_sentences(hits[n - 1]), 1) if "evidence" in s.lower())
    answered, _, _ = _ask(
        seed_rag,
        f"EVIDENCE: {n}.{i}\nANSWER: It rewards evidence selection [{n}].",
        question=question,
    )
    assert answered.outcome == "answered", answered.answer


def test_no_sentence_far_from_the_subject_is_not_covered(seed_rag):
    answer, _, _ = _ask(
        seed_rag,
        "EVIDENCE: NONE",
        not_stated_threshold=0.99,
        question="What did Palimpsa's authors eat for lunch in Vienna?",
    )
    if answer.abstained_by == "retrieval":  # the retrieval rule may refuse first: the same outcome
        assert answer.outcome == "not_covered"
    else:
        assert (
            answer.outcome == "not_covered"
            and answer.answer == ABSTAIN_ANSWER
            and not answer.citations
        )


def _ask_recorded(seed_rag, question: str, **settings):
    hits = seed_rag._retrieve(question)
    sources = [_source(i, h) for i, h in enumerate(hits, 1)]  # as an answer gets them
    chat = ScriptedChat("EVIDENCE: 1.1\nANSWER: The first source states this [1].")
    stream = AnswerStream(
        answering.respond(
            seed_rag.settings.model_copy(update={"llm_check": False, **settings}),
            seed_rag.store,
            seed_rag._answer_embedder,
            lambda: chat,
            question,
            question,
            hits,
            sources,
        )
    )
    return "".join(stream), stream.answer, chat


def test_a_topic_no_retrieved_paper_holds_is_not_put_to_the_model(seed_rag):
    """No seed paper says "spiking": the model, which would answer from the closest paper, is not
    asked, and the answer names the term."""
    question = "what's in here on training spiking neural networks?"
    text, answer, chat = _ask_recorded(seed_rag, question, not_stated_threshold=0.99)
    assert chat.calls == []
    assert answer.outcome == "not_covered" and answer.abstained and answer.abstained_by == "topic"
    assert (
        text == answer.answer == ABSENT_TOPIC_ANSWER.format(terms="“spiking”")
        and not answer.citations
    )
    # On the subject (a close paper), the closest sentence is quoted under the same words
    text, answer, chat = _ask_recorded(seed_rag, question, not_stated_threshold=0.0)
    assert chat.calls == [] and answer.outcome == "not_stated"
    assert (
        answer.answer.startswith(ABSENT_TOPIC_LEAD.format(terms="“spiking”")) and answer.citations
    )
    # With the check off, the library of papers outside the index holds it back
    # (rag/answer/rules/background.py); with both off, the model answers
    _, answer, chat = _ask_recorded(seed_rag, question, topic_check=False)
    assert (
        chat.calls == [] and answer.outcome == "not_covered" and answer.abstained_by == "background"
    )
    _, answer, chat = _ask_recorded(seed_rag, question, topic_check=False, background_check=False)
    assert chat.kinds == ["stream"] and answer.outcome == "answered"


def test_a_name_no_retrieved_paper_writes_is_named_as_not_stated(seed_rag):
    question = (
        "what PSNR does the hierarchical image tokenization super-resolution model get on DIV2K?"
    )
    _, answer, chat = _ask_recorded(seed_rag, question)
    assert chat.calls == [] and answer.outcome == "not_stated"
    assert answer.answer.startswith(ABSENT_TOPIC_LEAD.format(terms="“PSNR” or “DIV2K”"))
    assert "Hierarchical Image Tokenization" in answer.sources[0].title and answer.sources[0].cited


def test_a_question_whose_terms_a_paper_holds_is_put_to_the_model(seed_rag):
    _, answer, chat = _ask_recorded(seed_rag, "How does Palimpsa relate to Mamba2?")
    assert chat.kinds == ["stream"] and answer.outcome == "answered"


def test_which_papers_is_a_list_of_papers_each_with_its_sentence(seed_rag):
    question = "Which papers propose new attention or sequence models?"
    hits = seed_rag._retrieve(question)
    shown = evidence.choose_sentences(
        question,
        [_sentences(h) for h in hits],
        400,
        100,
        lambda t: seed_rag._answer_embedder.embed(t, truncate=True),
    )
    answer, _, _ = _ask(
        seed_rag, "EVIDENCE: 1.1, 2.1, 2.2\nANSWER: Several papers do [1][2].", question=question
    )
    lines = [line for line in plain_text(answer.answer).splitlines() if line.startswith("- ")]
    assert len(lines) == 2  # one line per paper, with one of its sentences shown to the model
    assert lines[0].startswith(f"- {hits[0].paper.display_title}: ") and lines[0].endswith(" [1]")
    assert (
        lines[0].removeprefix(f"- {hits[0].paper.display_title}: ").removesuffix(" [1]") in shown[0]
    )
    assert lines[1].endswith(" [2]") and any(lines[1].endswith(f": {s} [2]") for s in shown[1])
    assert answer.outcome == "answered" and [s.cited for s in answer.sources[:2]] == [True, True]


def test_the_free_style_is_still_there(seed_rag):
    answer, _, _ = _ask(
        seed_rag, "Palimpsa generalises Mamba2 as a self-attention model [1].", answer_style="free"
    )
    assert answer.outcome == "answered" and answer.answer.startswith("Palimpsa generalises")
    assert "EVIDENCE" not in answer.answer


def test_a_reply_without_evidence_whose_words_fail_quotes_what_it_cited(seed_rag):
    """No EVIDENCE line and a synthesis the check rejects (a number the abstract lacks): the
    sentence of the source it cited that its claim meant is quoted instead, and nothing unsupported
    stays."""
    first = _sentences(seed_rag._retrieve(Q)[0])
    answer, _, _ = _ask(seed_rag, "Mamba2 is a special case of Palimpsa in 97% of settings [1].")
    assert answer.outcome == "answered" and "97%" not in answer.answer
    assert plain_text(answer.answer).strip() in {f"- {s} [1]" for s in first}
    assert all(c.supported for c in answer.citations)


def test_a_synthesis_that_grafts_the_question_onto_a_source_is_dropped(seed_rag):
    """The words of the question pasted onto what an unrelated abstract says: dropped, the quote
    stays."""
    question = "How do knowledge graph embedding methods do link prediction?"
    hits = seed_rag._retrieve(question)
    first = _sentences(hits[0])
    assert grafted_words(
        f"Knowledge graph embedding methods do link prediction by {first[0]}",
        hits[0].chunk.abstract,
        question,
    )
    answer, _, _ = _ask(
        seed_rag,
        f"EVIDENCE: 1.1\nANSWER: Knowledge graph embedding methods do link prediction "
        f"by {first[0].rstrip('.')} [1].",
        question=question,
    )
    if answer.outcome == "answered":
        assert "link prediction by" not in answer.answer
        assert plain_text(answer.answer).strip().startswith("- ")
    # The paper's own words are no graft.
    assert grafted_words(first[0], hits[0].chunk.abstract, question) == []


def test_a_synthesis_that_copies_a_sentence_but_swaps_a_name_is_dropped(seed_rag):
    """The README's example as Qwen answered it: "Palimpsa is a special case of Palimpsa where
    forgetting dominates", copied from "... Mamba2 is a special case of Palimpsa where forgetting
    dominates" but for the subject. Every word is in the abstract, so the support check passed it;
    it is dropped, the quote stays."""
    question = "How does Palimpsa relate to Mamba2?"
    hits = seed_rag._retrieve(question)
    first = _sentences(hits[0])
    i = next(i for i, s in enumerate(first, 1) if "Mamba2 is a special case of Palimpsa" in s)
    swapped = "Palimpsa is a special case of Palimpsa where forgetting dominates [1]."
    assert swapped_names(swapped, hits[0].chunk.abstract) == [("Palimpsa", "Mamba2")]
    answer, _, _ = _ask(seed_rag, f"EVIDENCE: 1.{i}\nANSWER: {swapped}", question=question)
    assert answer.outcome == "answered" and "Palimpsa is a special case" not in answer.answer
    assert f"- {first[i - 1]} [1]" in plain_text(answer.answer)
    # The sentence as the abstract has it, a paraphrase, or the paper's own name for its method:
    # kept.
    for kept in (
        "Mamba2 is a special case of Palimpsa where forgetting dominates [1].",
        "Palimpsa generalizes Mamba2 as the case where forgetting dominates [1].",
    ):
        assert swapped_names(kept, hits[0].chunk.abstract) == []
        answer, _, _ = _ask(seed_rag, f"EVIDENCE: 1.{i}\nANSWER: {kept}", question=question)
        assert plain_text(answer.answer).endswith("\n\n" + kept)  # quote, then synthesis


def test_a_source_that_shows_no_sentence_is_never_quoted():
    """A source whose every sentence was dropped as an instruction shows none: citing it quotes
    nothing (found by the hostile corpus: it crashed the settling of the evidence)."""
    shown = [
        evidence.ShownSource(1, "A", ["Our model cuts memory use by half."]),
        evidence.ShownSource(2, "B", []),
    ]

    def embed(texts):
        import numpy as np

        return np.ones((len(texts), 3), dtype=np.float32) / np.sqrt(3)

    assert evidence.settle_evidence(
        [(1, 1)], shown, "It cuts memory [1]. It obeys [2].", "q", False, embed
    ) == [(1, 1)]
    assert evidence.settle_evidence([], shown, "It obeys [2].", "q", True, embed) == []
