"""rag/answer/sentence_vectors.py: the vectors of questions and source sentences remembered across
questions.

The counting embedders here are fakes of the `Embedder` seam (plumbing: what is computed and when);
the tests over a real `RAG` use the bundled model, where what is asserted is that answers do not
change.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from rag import RAG
from rag.answer.disk_vectors import DiskVectors
from rag.answer.sentence_vectors import SentenceVectors
from rag.testing import HashEmbedder
from tests.conftest import icml_rows


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


# ---- kept on disk across processes (rag/answer/disk_vectors.py) --------------------------------


@pytest.mark.parametrize(
    "vector", [[0.1, 0.2, 0.3], [0.5, 0.25, -0.125]], ids=["float64", "float32-exact"]
)
def test_a_new_memo_reads_the_kept_vectors_instead_of_embedding_them(tmp_path, vector):
    """A new process in effect (a fresh memo over the same file): nothing is embedded again, and
    each vector is the model's numbers exactly."""

    class Fixed(Counting):
        def embed(self, texts, truncate=False):
            super().embed(texts, truncate)
            return [[v + i for v in vector] for i, _ in enumerate(texts)]

    path = tmp_path / "vectors.sqlite"
    first_model, second_model = Fixed(), Fixed()
    first = SentenceVectors(first_model, disk=DiskVectors(path, "m")).embed(
        ["a", "b"], truncate=True
    )
    second = SentenceVectors(second_model, disk=DiskVectors(path, "m")).embed(
        ["b", "a", "c"], truncate=True
    )
    assert second[:2] == [first[1], first[0]] and second[2] == vector
    assert second_model.embedded == [("c", True)]
    other = Fixed()  # another model's identity shares nothing
    SentenceVectors(other, disk=DiskVectors(path, "n")).embed(["a"], truncate=True)
    assert other.embedded == [("a", True)]


def test_a_damaged_row_is_embedded_again_and_rewritten(tmp_path):
    path = tmp_path / "vectors.sqlite"
    SentenceVectors(Counting(), disk=DiskVectors(path, "m")).embed(["a", "b"], truncate=True)
    with sqlite3.connect(path) as db:  # a flipped byte in one row, another row truncated
        rows = db.execute("SELECT key, vector FROM vectors").fetchall()
        damaged = [bytes(rows[0][1][:-1]) + bytes([rows[0][1][-1] ^ 1]), bytes(rows[1][1][:3])]
        for (key, _), blob in zip(rows, damaged):
            db.execute("UPDATE vectors SET vector = ? WHERE key = ?", (blob, key))
    model = Counting()
    got = SentenceVectors(model, disk=DiskVectors(path, "m")).embed(["a", "b"], truncate=True)
    assert got == model.inner.embed(["a", "b"], truncate=True)
    assert sorted(model.embedded) == [("a", True), ("b", True)]
    again = Counting()
    SentenceVectors(again, disk=DiskVectors(path, "m")).embed(["a", "b"], truncate=True)
    assert again.embedded == []


@pytest.mark.parametrize("damage", ["not a database", "a directory", "read-only"])
def test_a_file_that_cannot_be_used_leaves_the_vectors_as_computed(tmp_path, damage):
    path = tmp_path / "cache" / "vectors.sqlite"
    path.parent.mkdir()
    if damage == "not a database":
        path.write_bytes(b"\x00garbage" * 100)
    elif damage == "a directory":
        path.mkdir()
    else:
        path.parent.chmod(0o500)
    try:
        model = Counting()
        memo = SentenceVectors(model, disk=DiskVectors(path, "m"))
        assert memo.embed(["a"], truncate=True) == model.inner.embed(["a"], truncate=True)
        assert memo.embed(["b", "a"], truncate=True)[0] == model.inner.embed(["b"])[0]
    finally:
        path.parent.chmod(0o700)


def _keep_texts(path: str, offset: int) -> None:
    memo = SentenceVectors(HashEmbedder(), disk=DiskVectors(Path(path), "m"))
    for i in range(40):
        memo.embed([f"text {(offset + i * 7 + j) % 150}" for j in range(5)], truncate=True)


def test_processes_writing_at_once_keep_every_vector_right(tmp_path):
    """Three processes (each `rag ask` is one) writing the same file at once: every kept vector is
    the model's, none lost to a locked file past what the next process would recompute."""
    import multiprocessing

    path = tmp_path / "vectors.sqlite"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_keep_texts, args=(str(path), n * 50)) for n in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    texts = [f"text {i}" for i in range(150)]
    kept = DiskVectors(path, "m").get(texts)
    assert len(kept) >= 50  # a write that waits past 2 s for the lock is skipped
    for text, vector in kept.items():
        assert vector.tolist() == HashEmbedder().embed([text], truncate=True)[0]


def test_a_file_another_process_holds_is_skipped_then_used_again(tmp_path):
    import numpy as np

    path = tmp_path / "vectors.sqlite"
    disk = DiskVectors(path, "m")
    one = np.array([0.5], dtype=np.float32)
    disk.put({"a": one})
    holder = sqlite3.connect(path)
    holder.execute("BEGIN EXCLUSIVE")  # another writer, past the 2 s wait
    disk.put({"b": one})
    holder.rollback()
    holder.close()
    disk.put({"c": one})
    assert set(disk.get(["a", "b", "c"])) == {"a", "c"}


def test_the_oldest_rows_go_first_past_the_limit(tmp_path):
    path = tmp_path / "vectors.sqlite"
    for text in ["a", "b", "c", "d"]:
        SentenceVectors(Counting(), disk=DiskVectors(path, "m", max_rows=3)).embed(
            [text], truncate=True
        )
    assert set(DiskVectors(path, "m").get(["a", "b", "c", "d"])) == {"b", "c", "d"}


def test_a_new_engine_answers_the_same_from_kept_vectors_without_embedding_a_source(
    seed_store, tmp_path, monkeypatch
):
    """The bundled model: an engine started after another has answered (a new `rag ask`) reads
    every source text's vector from the file, and answers as an engine without the file does."""
    questions = ["How does Palimpsa relate to Mamba2?", "Which papers study diffusion models?"]

    def answers(**settings) -> list[dict]:
        rag = RAG(store_dir=seed_store, llm="none", model_cache_dir=tmp_path, **settings)
        return [rag.ask(q).model_dump(exclude={"seconds"}) for q in questions]

    without = answers(answer_vector_cache=False)
    assert not (tmp_path / "answer-vectors").exists()
    first = answers()
    scorer = RAG(store_dir=seed_store, llm="none")._answer_embedder.embedder
    embedded: list[str] = []
    real_embed = scorer.embed

    def counting(texts, truncate=False):
        embedded.extend(texts)
        return real_embed(texts, truncate=truncate)

    monkeypatch.setattr(scorer, "embed", counting)
    assert answers() == first == without
    assert set(embedded) <= set(questions)  # the questions' own vectors only


def test_the_bundled_scorers_vectors_do_not_depend_on_their_batch():
    """What keeping them is safe on: a text's vector is the same bits embedded alone, in a batch,
    or in another order, so a kept vector is the one this answer would compute."""
    import numpy as np

    from rag.answer.citations import split_sentences
    from rag.backends.embedders.onnx import OnnxMiniLM

    sentences = [s for r in icml_rows(8) for s in split_sentences(r["abstract"])][:60]
    model = OnnxMiniLM("all-MiniLM-L6-v2")
    together = np.array(model.embed(sentences, truncate=True))
    alone = np.array([model.embed([s], truncate=True)[0] for s in sentences])
    reversed_ = np.array(model.embed(sentences[::-1], truncate=True))[::-1]
    assert np.array_equal(together, alone) and np.array_equal(together, reversed_)
