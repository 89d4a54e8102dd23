"""Citation parsing, renumbering and support checking, on scripted model outputs (no model needed)."""

from __future__ import annotations

from rag.citations import grounding, parse_markers, renumber, supports
from rag.models import Source


def _sources(n: int) -> list[Source]:
    passages = ["Palimpsa uses Bayesian metaplasticity for attention states.",
                "Mamba2 is a special case where forgetting dominates.",
                "Diffusion models predict protein structures."]
    return [Source(n=i + 1, paper_id=f"P{i + 1}", title=f"T{i + 1}", score=0.5, passage=passages[i % 3])
            for i in range(n)]


def test_parse_marker_forms():
    assert parse_markers("a [1] b [2, 3] c [4][5] d [6-8] e [2; 9]") == [1, 2, 3, 4, 5, 6, 7, 8, 2, 9]
    assert parse_markers("no markers, [x] or [] here") == []


def test_renumber_in_order_of_first_use_and_drop_invalid():
    text = "Mamba2 is a special case where forgetting dominates [2]. Palimpsa uses metaplasticity [1][7]."
    new_text, citations, sources, invalid = renumber(text, _sources(3))
    assert new_text == "Mamba2 is a special case where forgetting dominates [1]. Palimpsa uses metaplasticity [2]."
    assert invalid == [7]
    assert [(s.n, s.paper_id, s.cited) for s in sources] == [(1, "P2", True), (2, "P1", True), (3, "P3", False)]
    assert [(c.n, c.paper_id) for c in citations] == [(1, "P2"), (2, "P1")]


def test_support_check_marks_unsupported_claims():
    text = "Palimpsa uses Bayesian metaplasticity [1]. It was trained on ten thousand GPUs in Antarctica [2]."
    _, citations, _, _ = renumber(text, _sources(2))
    assert [c.supported for c in citations] == [True, False]
    assert grounding(citations) == 0.5
    assert supports("Diffusion models predict protein structures [3].", "Diffusion models predict protein structures.")


def test_grouped_markers_are_split_and_deduplicated():
    new_text, citations, _, _ = renumber("Both are attention models [2, 1, 2].", _sources(2))
    assert new_text == "Both are attention models [1][2]."
    assert [c.paper_id for c in citations] == ["P2", "P1"]
