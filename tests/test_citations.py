"""Citation parsing, renumbering (whole and streamed) and support checking, on scripted model
outputs: a unit test of logic no real model can drive deterministically."""

from __future__ import annotations

import pytest

from rag.answer.citations import (
    MarkerRewriter,
    check_support,
    escape_quote,
    novel_terms,
    parse_markers,
    plain_text,
    renumber,
    split_sentences,
)
from rag.models import Source

PASSAGES = [
    (
        "Palimpsa uses Bayesian metaplasticity, where the plasticity of each attention state is"
        " tied to an importance state."
    ),
    "We show that Mamba2 is a special case of Palimpsa where forgetting dominates.",
    "A diffusion model predicts protein structures from sequences.",
]


def _sources(n: int) -> list[Source]:
    return [
        Source(n=i + 1, paper_id=f"P{i + 1}", title=f"T{i + 1}", score=0.5, passage=PASSAGES[i % 3])
        for i in range(n)
    ]


def test_parse_marker_forms():
    text = "a [1] b [2, 3] c [4][5] d [6-8] e [2; 9] f [Source 10]"
    assert parse_markers(text) == [1, 2, 3, 4, 5, 6, 7, 8, 2, 9, 10]
    assert parse_markers("no markers, [x], [] or [a1] here") == []


def test_renumber_in_order_of_first_use_and_drop_invalid():
    text = (
        "Mamba2 is a special case of Palimpsa [2]. Palimpsa uses metaplasticity [1][7]. Also [9]."
    )
    new_text, sources, invalid = renumber(text, _sources(3))
    assert (
        new_text
        == "Mamba2 is a special case of Palimpsa [1]. Palimpsa uses metaplasticity [2]. Also."
    )
    assert invalid == [7, 9]
    assert [(s.n, s.paper_id, s.cited) for s in sources] == [
        (1, "P2", True),
        (2, "P1", True),
        (3, "P3", False),
    ]


def test_grouped_markers_are_split_and_deduplicated():
    new_text, sources, _ = renumber("Both are attention models [2, 1, 2].", _sources(2))
    assert new_text == "Both are attention models [1][2]."
    assert [s.paper_id for s in sources if s.cited] == ["P2", "P1"]


@pytest.mark.parametrize(
    "cuts", [[5, 19, 20, 40], [1, 2, 3, 4, 5, 6, 7], [len("Mamba2 is special [")], []]
)
def test_streamed_renumbering_equals_whole_text(cuts):
    text = "Mamba2 is special [2]. Palimpsa uses metaplasticity [1][7] and more [3, 9] text [12]."
    pieces, last = [], 0
    for c in cuts + [len(text)]:
        pieces.append(text[last:c])
        last = c
    rewriter = MarkerRewriter(3)
    streamed = "".join(rewriter.feed(p) for p in pieces) + rewriter.close()
    whole, _, invalid = renumber(text, _sources(3))
    assert (
        streamed.strip()
        == whole
        == "Mamba2 is special [1]. Palimpsa uses metaplasticity [2] and more [3] text."
    )
    assert rewriter.invalid == invalid == [7, 9, 12]


def test_an_unclosed_bracket_is_text_once_it_is_long():
    rewriter = MarkerRewriter(3)
    out = rewriter.feed("see [the appendix of the paper, which is long enough to not be a marker")
    assert out.startswith("see [the appendix")


def test_support_lexical_and_semantic():
    from rag.backends.embedders.onnx import OnnxMiniLM

    model = OnnxMiniLM()
    text = (
        "Palimpsa uses Bayesian metaplasticity for each attention state [1]. "
        "Mamba2 can be seen as a special case of Palimpsa in which forgetting dominates [2]. "
        "It was trained on ten thousand GPUs in Antarctica [1]. "
        "Both models are widely used in industry."
    )
    _, sources, _ = renumber(text, _sources(2))
    report = check_support(text, sources, embed=lambda t: model.embed(t, truncate=True))
    verdicts = {c.paper_id: c.supported for c in report.citations}
    # P1 is cited by a supported and an unsupported sentence: the citation is not supported.
    assert verdicts == {"P1": False, "P2": True}
    assert report.uncited == ["Both models are widely used in industry."]
    assert report.grounding == 0.5  # 2 of 4 claim sentences are grounded


def test_paraphrase_is_supported_only_with_embeddings():
    from rag.backends.embedders.onnx import OnnxMiniLM

    model = OnnxMiniLM()
    text = "Given an amino-acid sequence, a diffusion network predicts how the protein folds [1]."
    sources = [Source(n=1, paper_id="P3", title="T", score=1.0, passage=PASSAGES[2], cited=True)]
    assert check_support(text, sources).citations[0].supported is False
    assert (
        check_support(text, sources, embed=lambda t: model.embed(t, truncate=True))
        .citations[0]
        .supported
    )
    # Sharing words is not enough: a claim the passage does not make stays unsupported.
    off = "Diffusion models are used for image generation [1]."
    assert (
        not check_support(off, sources, embed=lambda t: model.embed(t, truncate=True))
        .citations[0]
        .supported
    )


def test_evidence_is_the_passage_sentence_behind_the_claim():
    passage = (
        "Palimpsa is a self-attention model. It uses Bayesian metaplasticity for each attention"
        " state. Experiments cover language modelling."
    )
    sources = [Source(n=1, paper_id="P1", title="T", score=1.0, passage=passage, cited=True)]
    report = check_support("Palimpsa relies on Bayesian metaplasticity [1].", sources)
    assert report.evidence == {1: ["It uses Bayesian metaplasticity for each attention state."]}


def test_markers_after_the_period_belong_to_the_sentence_before():
    """Models often write "claim. [1]": the marker cites the sentence it follows, not the next
    one."""
    after = (
        "Palimpsa uses Bayesian metaplasticity for its attention states. [1] "
        "Mamba2 is a special case of Palimpsa where forgetting dominates. [2]"
    )
    before = (
        "Palimpsa uses Bayesian metaplasticity for its attention states [1]. "
        "Mamba2 is a special case of Palimpsa where forgetting dominates [2]."
    )
    glued = after.replace(". [", ".[")
    for text in (after, before, glued):
        report = check_support(text, _sources(2))
        assert [c.supported for c in report.citations] == [True, True], text
        assert report.grounding == 1.0 and report.uncited == []


def test_sentences_keep_abbreviations_and_lines():
    assert split_sentences(
        "Methods, e.g. LoRA, adapt [1]. Smith et al. show more. [2]\n- a point [3]"
    ) == ["Methods, e.g. LoRA, adapt [1].", "Smith et al. show more. [2]", "- a point [3]"]


def test_escaped_brackets_are_text_not_markers():
    quote = escape_quote(r"W[1]-hard on [0,1] with \alpha")
    assert parse_markers(quote) == [] and parse_markers(quote + " [2]") == [2]
    assert plain_text(quote) == r"W[1]-hard on [0,1] with \alpha"
    new_text, sources, invalid = renumber(quote + " [2]", _sources(3))
    assert (
        new_text == quote + " [1]"
        and invalid == []
        and [s.paper_id for s in sources if s.cited] == ["P2"]
    )


def test_a_claim_naming_what_its_passage_does_not_is_unsupported():
    """A small model's typical slip: the sentence echoes the passage but swaps in a number or a
    name."""
    passage = (
        "FormalRx-8B is a general-purpose LLM fine-tuned for formal verification. PLaID++ generates"
        " stable structures at a $>$50\\% greater rate, with 2{,}000 verified examples."
    )
    src = [Source(n=1, paper_id="P1", title="FormalRx", score=0.5, passage=passage)]
    assert novel_terms("FormalRx-8B is fine-tuned from Llama-3-8B [1].", passage) == ["Llama-3-8B"]
    assert novel_terms("PLaID++ generates stable structures 10% more often [1].", passage) == [
        "10%"
    ]
    assert (
        novel_terms(
            "PLaID++ generates stable structures at a 50% greater rate, with 2,000 examples [1].",
            passage,
        )
        == []
    )
    assert (
        check_support("FormalRx-8B is a general-purpose LLM fine-tuned from Llama-3-8B [1].", src)
        .citations[0]
        .supported
        is False
    )
    assert (
        check_support(
            "FormalRx-8B is a general-purpose LLM fine-tuned for formal verification [1].", src
        )
        .citations[0]
        .supported
    )
