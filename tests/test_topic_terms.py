"""The question's topic terms and names that no retrieved paper holds (rag/answer/rules/topic.py),
on the shipped list of topic words and phrases."""

from __future__ import annotations

from rag.answer.rules.topic import (
    ABSENT_SHARE,
    absent_topic,
    missing_names,
    missing_topic_terms,
    topic_terms,
)

PREDICTIVE_CODING = (
    "Predictive Coding offers a brain-inspired alternative to backpropagation for neural network "
    "training. We introduce error-based PC, which does not suffer from signal decay."
)


def test_the_shipped_list_holds_subject_terms_and_not_everyday_words():
    words, phrases = topic_terms()
    assert {"spiking", "splatting", "watermarking"} <= words
    # everyday, or in few keywords
    assert not {"painfully", "hoping", "the", "model", "spotting", "mixes"} & words
    assert {"knowledg graph", "earli exit"} <= phrases  # stems, as the papers' words are folded


def test_a_topic_word_no_text_holds_is_missing():
    assert missing_topic_terms(
        "what's in here on training spiking neural networks?", [PREDICTIVE_CODING]
    ) == ["spiking"]
    held = PREDICTIVE_CODING + " We also train spiking neural networks."
    assert missing_topic_terms("what's in here on training spiking neural networks?", [held]) == []


def test_a_stem_held_as_the_start_of_a_longer_word_counts():
    # "backprop" is the start of "backpropagation": the question's short form is held
    assert "backprop" not in missing_topic_terms(
        "any alternatives to backprop?", [PREDICTIVE_CODING]
    )


def test_a_phrase_counts_only_with_its_words_side_by_side():
    question = "how do knowledge graph embedding methods do link prediction?"
    apart = "We build a graph of claims, and knowledge of each step is verified."
    assert missing_topic_terms(question, [apart]) == ["knowledge graph"]
    assert missing_topic_terms(question, ["Knowledge graphs store facts as triples."]) == []


def test_a_hyphenated_phrase_is_named_as_the_question_writes_it():
    question = "is there a paper on early-exit transformers that skip the remaining layers?"
    assert missing_topic_terms(question, ["Transformers can be trained to match a grammar."]) == [
        "early-exit"
    ]
    assert missing_topic_terms(question, ["An early exit after each layer saves compute."]) == []


def test_overlapping_phrases_are_named_as_one():
    question = "is there work on estimating heterogeneous treatment effects?"
    assert missing_topic_terms(question, ["We study bandits."]) == [
        "estimating heterogeneous treatment"
    ]


def test_names_are_compared_without_case_hyphens_or_a_final_s():
    assert missing_names(
        "How many parameters does GPT-3 have?", ["We compare with GPT-4 and Llama."]
    ) == ["GPT-3"]
    # "top-1" is no name
    assert missing_names("top-1 accuracy of ResNet-50?", ["ResNet50 reaches 76%."]) == []
    assert missing_names("does word2vec or gpt-4o win?", ["GPT-4o wins."]) == ["word2vec"]
    assert missing_names("which LLMs did they use?", ["An LLM judges each answer."]) == []
    # a hyphenated word without a digit is judged by its parts: GRPO is held, "style" is no name
    assert missing_names("Which papers use GRPO-style training?", ["We train with GRPO."]) == []
    # a name only compared with asks about another paper, as the retrieval rule has it
    assert (
        missing_names(
            "Is there a paper like DreamBooth but for crystals?", ["We generate crystals."]
        )
        == []
    )


def test_a_long_question_needs_more_than_one_absent_term():
    text = [
        "We propose a one-step generator distilled from a diffusion model by matching its outputs."
    ]
    short = "any papers on spiking networks?"
    long = (
        "when you turn a diffusion model into a generator that needs only one or two passes by"
        " pulling its outputs toward the teacher's, why does quality drop, spiking or not, and what"
        " fixes it?"
    )
    assert absent_topic(short, text) == ["spiking"]
    assert missing_topic_terms(long, text) == ["spiking"]
    assert len(["spiking"]) < ABSENT_SHARE * 20 and absent_topic(long, text) == []


def test_the_same_term_is_named_once():
    assert absent_topic("any papers on NeRF (nerf) rendering?", ["We study language models."]) == [
        "NeRF"
    ]
