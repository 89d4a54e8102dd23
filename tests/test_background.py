"""The library of papers outside the index (rag/answer/rules/background.py): the shipped vectors,
and real answers on the 76 seed papers with the real default embedder (extractive, so no LLM is
needed: the rule decides before any model reads)."""

from __future__ import annotations

import numpy as np
import pytest

from rag import RAG
from rag.answer.rules.background import LIBRARY_MODEL, library, library_best, uncovered
from rag.index.corpus import Paper
from rag.index.store import ChunkRow
from rag.retrieve.search import Hit

UNCOVERED = [  # topics no seed paper is about, each with many NeurIPS 2023-2025 papers
    "Is there work on federated learning with differential privacy?",
    "How do graph neural networks predict molecular properties?",
]
COVERED = [  # seed papers in other words, and a "which papers" question the seeds answer
    (
        "bandit setup where every round you pick one arm to look at and maybe a different arm to"
        " actually play. is there a cheap algorithm that's near optimal?"
    ),
    "which papers defend LLM agents against poisoned memories?",
]


def test_the_shipped_library_is_unit_vectors_of_the_default_model():
    vectors = library()
    assert vectors.shape[0] > 10_000 and vectors.shape[1] == 384
    norms = np.linalg.norm(vectors, axis=1)
    assert norms.min() > 0.98 and norms.max() < 1.02


@pytest.mark.parametrize("question", UNCOVERED)
def test_a_topic_the_library_holds_and_the_index_lacks_is_not_covered(
    seed_rag, seed_store, question
):
    answer = seed_rag.ask(question)
    assert answer.outcome == "not_covered" and answer.abstained_by == "background", answer.answer
    # the nearest indexed papers are listed
    assert "not in this index" in answer.answer and answer.sources
    # Turned off, the rule holds nothing back.
    off = RAG(store_dir=seed_store, llm="none", background_check=False).ask(question)
    assert off.abstained_by != "background"


@pytest.mark.parametrize("question", COVERED)
def test_questions_about_indexed_papers_are_not_held_back(seed_rag, question):
    answer = seed_rag.ask(question)
    assert answer.abstained_by != "background", answer.answer


def _hit(similarity: float, named: bool = False) -> Hit:
    paper = Paper(paper_id="p1", title="A paper")
    chunk = ChunkRow(rowid=1, chunk_id="p1-0", paper_id="p1", text="text", abstract="text")
    return Hit(paper=paper, chunk=chunk, score=similarity, similarity=similarity, named=named)


def test_the_margin_and_what_skips_the_rule():
    vector = library()[0]  # a library paper's own vector: the library's best is 1.0
    assert library_best(vector) == pytest.approx(1.0, abs=0.01)
    assert uncovered(LIBRARY_MODEL, vector, [_hit(0.83)], False, margin=0.15)
    assert not uncovered(LIBRARY_MODEL, vector, [_hit(0.90)], False, margin=0.15)
    # "Which papers" questions get more room; a hit holding a name the question asks about, a store
    # of another embedding model, or no hits: never.
    assert not uncovered(LIBRARY_MODEL, vector, [_hit(0.83)], True, margin=0.15)
    assert uncovered(LIBRARY_MODEL, vector, [_hit(0.80)], True, margin=0.15)
    assert not uncovered(LIBRARY_MODEL, vector, [_hit(0.50, named=True)], False, margin=0.15)
    assert not uncovered("all-mpnet-base-v2", vector, [_hit(0.50)], False, margin=0.15)
    assert not uncovered(LIBRARY_MODEL, vector, [], False, margin=0.15)
