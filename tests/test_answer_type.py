"""rag/answer/rules/answer_type.py: which questions ask for a number or for names, and whether a
text gives one the question did not already hold. The questions are the user-style set's wording
(eval/user_questions.jsonl) and near misses of the same forms; the evidence path's use of it is
in tests/test_evidence.py."""

from __future__ import annotations

import pytest

from rag.answer.rules.answer_type import (
    asked_type,
    from_another_paper,
    gives_asked_type,
    unwritten_names,
)


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        ("exactly how many times faster is ePC than sPC?", "number"),
        ("how many scientific disciplines does SafeSciBench cover?", "number"),
        (
            (
                "FormalRx-8B accuracy for error localization and for correction? what accuracy do"
                " they get"
            ),
            "number",
        ),
        ("what model sizes (in parameters) did SPARKLING widen from and to?", "number"),
        (
            (
                "besides their own benchmark, how much does the layer mixer help on MMSU? numbers"
                " please"
            ),
            "number",
        ),
        ("which agent benchmarks was A-MemGuard evaluated on?", "names"),
        ("what base LLM was CAMP fine-tuned from in their experiments?", "names"),
        ("which vision-only model and which VLM does GPUA align, like DINOv2 to CLIP?", "names"),
        ("which model came out on top in the CodeClash tournaments?", "names"),
        # a reason, a method, a list of papers, or a noun that is not a kind of named thing
        (
            (
                "why do search-based decoding methods go wrong when each query has a cap on how"
                " many tokens they spend?"
            ),
            None,
        ),
        ("how does Palimpsa relate to Mamba2?", None),
        ("which papers study backdoor attacks on language models?", None),
        (
            (
                "the emotion wheels LLM paper, which groups did the models misclassify emotions for"
                " the most?"
            ),
            None,
        ),
        ("what are the two pretraining objectives in NAVI?", None),
        (
            (
                "that paper unifying adversarial robustness for text scoring models, which kinds of"
                " models does it cover?"
            ),
            None,
        ),
    ],
)
def test_the_asked_type_comes_from_the_question(question, kind):
    assert asked_type(question) == kind


@pytest.mark.parametrize(
    ("question", "text", "gives"),
    [
        # a number, written in digits or words, that the question does not hold
        (
            "how many benchmarks was FedARC evaluated on?",
            "Experiments on five public benchmarks show gains. [1]",
            True,
        ),
        ("how many experts does CoME have?", "- CoME consists of 4 distinct experts. [1]", True),
        ("how many rounds did they win?", "- They won zero rounds. [1]", True),
        (
            "exactly how many times faster is ePC than sPC?",
            "- ePC runs orders of magnitude faster than sPC. [1]",
            False,
        ),
        # the citation marker's number and the question's own numbers do not count
        (
            "how much does it improve on top of Qwen2.5?",
            "It improves substantially over Qwen2.5 [2].",
            False,
        ),
        # a name the question did not hold; the wh-word's own noun ("LLM") is no answer
        (
            "which agent benchmarks was A-MemGuard evaluated on?",
            "- A-MemGuard was evaluated on multiple benchmarks. [1]",
            False,
        ),
        (
            "which LLM scored best on CYBERTEAM?",
            "- CYBERTEAM evaluates every LLM in two stages. [1]",
            False,
        ),
        (
            "which benchmarks was Palimpsa evaluated on?",
            (
                "- Palimpsa outperforms baselines on the Multi-Query Associative Recall (MQAR)"
                " benchmark. [1]"
            ),
            True,
        ),
        # a sentence's first word is not a name
        (
            "what base LLM was CAMP fine-tuned from?",
            "- However, CAMP adapts the margin. [1]",
            False,
        ),
        # a quantity in mathematics answers a number question; the letters of "S&D" and a bare big-O
        # do not
        (
            "how many memory blocks does the fast memory need?",
            "- if the fast memory has at least k memory blocks. [1]",
            True,
        ),
        (
            "how many reward queries does it need?",
            "- with 𝒪̃((α⁻¹ + ε⁻¹)/γ²) reward queries. [1]",
            True,
        ),
        ("how much does S&D raise accuracy?", "- S&D is parameter-free. [1]", False),
        (
            "how much faster is the FTPL policy?",
            "- It achieves optimal 𝒪(√(KT)) regret. [1]",
            False,
        ),
        # the question's own names: parts of hyphenated words, acronyms of its capitalised words
        (
            "which reasoning models did the LRM-traces paper analyze?",
            "- We introduce a scalable LRM benchmark. [1]",
            False,
        ),
        (
            "what concept discovery model does Neural Concept Verifier use?",
            "- NCV uses discovery models. [1]",
            False,
        ),
        # questions asking for neither are never held back here
        ("how does Palimpsa relate to Mamba2?", "It generalises it [1].", True),
        # the acronym of the question's words in any case, capitals compared ("heterogeneous FL" is
        # HtFL)
        (
            "which image datasets is the neural concept verifier evaluated on?",
            "- We introduce NCV, a framework. [1]",
            False,
        ),
        (
            "which heterogeneous FL baselines did FedARC compare against?",
            "- FedARC outperforms HtFL baselines. [1]",
            False,
        ),
        (
            "what LLM did the policy gradient barrier paper use?",
            "- A variant of PG reaches likelihood 1. [1]",
            False,
        ),
        # a word mostly in lower case is no acronym: DeepSeek is a name even where "deep sparse" is
        # DS
        (
            "which MoE models was the deep sparse pruning tested on?",
            "- It prunes DeepSeek MoEs. [1]",
            True,
        ),
        # a definition of the question's subject, or of a generic term, names neither
        (
            "what base LLM was CAMP fine-tuned from?",
            (
                "- We propose Conflict-Aware Adaptive Margin Preference Alignment (CAMP), which"
                " models conflicts. [1]"
            ),
            False,
        ),
        (
            "which real-world datasets was the recommender exposure paper tested on?",
            "- Recommender systems (RS) may suffer from exposure concentration. [1]",
            False,
        ),
        (
            "which agent benchmarks was A-MemGuard evaluated on?",
            "- Agents built on Large Language Models (LLMs) rely on memory. [1]",
            False,
        ),
        (
            "which agent benchmarks was A-MemGuard evaluated on?",
            "- We introduce A-MemGuard (Agent-Memory Guard), a defense. [1]",
            False,
        ),
        (
            "which agent benchmarks was A-MemGuard evaluated on?",
            "- We compare with MemGPT (Memory GPT) on WebShop. [1]",
            True,
        ),
        # a part of the question's own word
        (
            "which agent benchmarks was A-MemGuard evaluated on?",
            "- We build the Guard on consensus. [1]",
            False,
        ),
        # "e.g." holds no quantity; "no additional" is zero
        (
            "how much did best-of-N amplify the bias?",
            "- Biases (e.g., sexism) are amplified. [1]",
            False,
        ),
        (
            "how many extra forward passes does it need?",
            "- It needs no additional forward passes. [1]",
            True,
        ),
        ("how many extra forward passes does it need?", "- It needs no retraining. [1]", False),
        # a names question may list its kinds of thing before the noun
        (
            "which math, qa and code benchmarks did they use?",
            "- We use MATH500 and HumanEval. [1]",
            True,
        ),
        (
            "which math, qa and code benchmarks did they use?",
            "- We use standard math benchmarks. [1]",
            False,
        ),
    ],
)
def test_an_answer_gives_the_asked_type_only_with_something_new(question, text, gives):
    assert gives_asked_type(question, text) is gives


def test_a_name_the_sources_define_as_the_questions_subject_is_no_answer():
    """ "RPG" means the paper the question describes when its abstract defines it with the
    question's words."""
    question = (
        "PPO-style reuse of reparameterization gradients - which environments did they test on?"
    )
    text = "- RPG optimizes a PPO-style surrogate objective. [1]"
    assert gives_asked_type(question, text)
    assert not gives_asked_type(
        question, text, ["We study reparameterization policy gradient (RPG) methods."]
    )
    assert gives_asked_type(question, text, ["We compare against Reward Policy Games (RPG)."])


HONEYPOTS = "training with honeypots: by how much did harmful failures drop?"


@pytest.mark.parametrize(
    "pieces, scores, borrowed",
    [
        # the figure only in a source matching the question far less than the best one: another
        # paper's
        ([(2, "It cuts attack success rates by over 95%.")], {1: 16.5, 2: 4.4}, True),
        (
            [
                (1, "Harmful failures drop sharply."),
                (2, "It cuts attack success rates by over 95%."),
            ],
            {1: 16.5, 2: 4.4},
            True,
        ),
        # the figure in the paper asked about, or in one nearly as close to the question
        (
            [(1, "Harmful failures drop by 40%."), (2, "It cuts attack success by 95%.")],
            {1: 16.5, 2: 4.4},
            False,
        ),
        ([(2, "It cuts harmful failures by 95%.")], {1: 16.5, 2: 9.0}, False),
        # no figure at all is answer_type's case, not this one; nor are sources without keyword
        # scores
        ([(2, "Harmful failures drop sharply.")], {1: 16.5, 2: 4.4}, False),
        ([(2, "It cuts attack success rates by over 95%.")], {1: 0.0, 2: 0.0}, False),
    ],
)
def test_a_figure_borrowed_from_another_paper_is_told_apart(pieces, scores, borrowed):
    assert from_another_paper(HONEYPOTS, pieces, scores) is borrowed


def test_questions_asking_for_neither_type_never_borrow():
    assert not from_another_paper(
        "how does Palimpsa relate to Mamba2?", [(2, "It is 3x faster.")], {1: 9.0, 2: 1.0}
    )


def test_an_unclosed_bracket_before_a_long_word_is_read_at_once():
    """A bracket that never closes, before a long word (a URL, a formula): reading the
    definitions in brackets once backtracked over every way to split the word (8 s for 40
    letters, doubling with each letter); a hang here is that regression."""
    text = "- It is Model (" + "x" * 400 + " and more [1]."
    assert gives_asked_type("which benchmarks was Model evaluated on?", text, [text]) is False


@pytest.mark.parametrize(
    "question, cited, unwritten",
    [
        # the answer cites another model's figure on the same dataset (5,871 papers, a live run)
        (
            "What top-1 accuracy did ResNet-50 reach on ImageNet in the original ResNet paper?",
            [
                "On ImageNet-1K, DeiT-Tiny distilled from CaiT-S24 improves from 74.86% to 77.53%"
                " top-1 accuracy."
            ],
            ["ResNet-50"],
        ),  # said once
        # the right paper, which does not say which base model it trained (a near miss)
        (
            (
                "which multimodal base model did DeFacto train with GRPO, Qwen2.5-VL or something"
                " else?"
            ),
            ["DeFacto. We train MLLMs with GRPO-based reinforcement learning and three rewards."],
            ["Qwen2.5-VL"],
        ),
        # written in any case, with a hyphen or a plural, by any of the cited papers
        (
            "how does NAVI pretrain on tables?",
            ["We propose Navi, a segment-centric framework."],
            [],
        ),
        ("What does S-SPPO add?", ["A paper on reranking.", "We introduce $\\textit{S}$-SPPO"], []),
        # names of nothing in particular
        ("which LLMs and GPUs did they use?", ["We train LLM agents."], []),
        # an acronym the cited text spells out
        (
            "which many-shot ICL effect does their model explain?",
            ["We study in-context learning."],
            [],
        ),
        ("how many experts does the MoE have?", ["A mixture of experts with 8 experts."], []),
        # a name the question only compares with is not asked about
        ("a method like DreamBooth but for crystals?", ["We generate crystal structures."], []),
    ],
)
def test_names_the_cited_papers_never_write_are_found(question, cited, unwritten):
    assert unwritten_names(question, cited) == unwritten
