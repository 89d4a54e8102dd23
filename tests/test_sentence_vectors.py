"""rag/answer/sentence_vectors.py: the vectors of questions and source sentences remembered across
questions.

The counting embedders here are fakes of the `Embedder` seam (plumbing: what is computed and when);
the last tests use the bundled model through a real `RAG`, where what is asserted is that answers do
not change.
"""

from __future__ import annotations

import threading

import pytest

from rag import RAG
from rag.answer.sentence_vectors import SentenceVectors
from rag.testing import HashEmbedder


class Counting:
    """A fake embedder (HashEmbedder's vectors) that records every text it is asked to embed."""

    def __init__(self) -> None:
        self.inner = HashEmbedder()
        self.embedded: list[tuple[str, bool]] = []
        self.queries: list[str] = []
        self.model_id, self.max_tokens = self.inner.model_id, self.inner.max_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        self.embedded += [(t, truncate) for t in texts]
        return self.inner.embed(texts, truncate=truncate)

    def embed_query(self, text: str) -> list[float]:
        self.queries.append(text)
        return self.inner.embed_query(text)


def test_remembered_sentences_are_not_embedded_again_and_keep_their_vectors():
    model = Counting()
    memo = SentenceVectors(model)
    first = memo.embed(["a b", "c d", "a b"], truncate=True)
    assert model.embedded == [("a b", True), ("c d", True)]  # each distinct text once, in one call
    again = memo.embed(["c d", "e f", "a b"], truncate=True)
    assert model.embedded[2:] == [("e f", True)]
    assert again[0] == first[1] and again[2] == first[0] == first[2]
    assert again[1] == model.inner.embed(["e f"], truncate=True)[0]


def test_without_truncate_texts_pass_through_and_are_not_remembered():
    """Ingest's texts (never truncated) are the index's, not answering's: nothing to remember."""
    model = Counting()
    memo = SentenceVectors(model)
    memo.embed(["chunk"]), memo.embed(["chunk"])
    assert model.embedded == [("chunk", False), ("chunk", False)]


def test_questions_come_from_the_models_query_vector_and_are_remembered():
    """With task prefixes (nomic-embed-text-v1.5) a question is not embedded as a document is."""

    class Asymmetric(Counting):
        def embed(self, texts, truncate=False):
            super().embed(texts, truncate)
            return [[1.0, 0.0] for _ in texts]

        def embed_query(self, text):
            super().embed_query(text)
            return [0.0, 1.0]

    model = Asymmetric()
    memo = SentenceVectors(model)
    assert memo.embed_query("q") == [0.0, 1.0] == memo.embed_query("q")
    assert memo.embed(["q"], truncate=True) == [[1.0, 0.0]]
    assert model.queries == ["q"]


def test_the_least_recently_used_are_dropped_first():
    model = Counting()
    memo = SentenceVectors(model, capacity=2, query_capacity=1)
    memo.embed(["a", "b"], truncate=True)
    memo.embed(["a"], truncate=True)  # a is now the most recent
    memo.embed(["c"], truncate=True)  # drops b
    memo.embed(["a", "b"], truncate=True)
    assert [t for t, _ in model.embedded] == ["a", "b", "c", "b"]
    memo.embed_query("q1"), memo.embed_query("q2"), memo.embed_query("q1")
    assert model.queries == ["q1", "q2", "q1"]


@pytest.mark.parametrize(
    "vector", [[0.1, 0.2, 0.3], [0.5, 0.25, -0.125]], ids=["float64", "float32-exact"]
)
def test_a_remembered_vector_is_the_models_numbers_exactly(vector):
    class Fixed(Counting):
        def embed(self, texts, truncate=False):
            return [list(vector) for _ in texts]

    memo = SentenceVectors(Fixed())
    assert memo.embed(["x"], truncate=True) == [vector] == memo.embed(["x"], truncate=True)


def test_threads_sharing_one_memo_get_each_texts_own_vector():
    model = Counting()
    memo = SentenceVectors(model, capacity=50)
    texts = [f"sentence {i}" for i in range(200)]
    expected = dict(zip(texts, model.inner.embed(texts, truncate=True)))
    errors: list[str] = []

    def worker(offset: int) -> None:
        for i in range(300):
            batch = [texts[(offset + i + j) % len(texts)] for j in range(5)]
            for text, got in zip(batch, memo.embed(batch, truncate=True)):
                if got != expected[text]:
                    errors.append(text)

    threads = [threading.Thread(target=worker, args=(n * 37,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(memo._vectors) <= 50


def test_answers_are_the_same_from_a_fresh_engine_and_from_one_that_remembers(seed_store):
    """The bundled model: an engine that has answered the questions before gives the same answers,
    and embeds no source sentence the second time."""
    questions = [
        "How does Palimpsa relate to Mamba2?",
        "Which papers study diffusion models?",
        "What is test-time training?",
    ]
    warm = RAG(store_dir=seed_store, llm="none")
    first = [warm.ask(q).model_dump(exclude={"seconds"}) for q in questions]
    memo = warm._answer_embedder
    before = dict(memo._vectors)
    second = [warm.ask(q).model_dump(exclude={"seconds"}) for q in questions]
    fresh = [
        RAG(store_dir=seed_store, llm="none").ask(q).model_dump(exclude={"seconds"})
        for q in questions
    ]
    assert second == first == fresh
    assert before and dict(memo._vectors).keys() == before.keys()  # nothing new was embedded
