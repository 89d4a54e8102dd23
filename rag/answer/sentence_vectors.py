"""The vectors of source sentences, remembered across questions.

Answering embeds every sentence of each retrieved abstract, per question: to choose what the model
reads, to rank extractive quotes, to check that a cited sentence supports a claim. The same papers
come back question after question (a chat's follow-ups, a popular paper, an evaluation run), and
embedding their sentences again was most of an extractive answer's time: eight questions over the
seed papers, asked a second time, took 0.44 s each (median) without the memo and 0.03 s with it; the
first time, 0.46 s and 0.34 s, since the questions share papers (`python -m
bench.speed.sentence_vectors`, load ~1 on 2 cores).

`SentenceVectors(embedder)` is the embedder questions go through (retrieval and answering; ingest
never): `embed(texts, truncate=True)` returns each remembered text's vector and embeds only the
rest, in one batch; `embed_query` remembers questions the same way (retrieval and the extractive
answer both embed the question). The last `capacity` texts and `query_capacity` questions are kept,
the least recently used dropped first; `embed` without `truncate` passes through. With `disk`
(rag/answer/disk_vectors.py), source texts not in memory are looked up there before they are
embedded, so a new process starts with the vectors earlier ones computed. A vector is stored
as float32 when that keeps it exactly (the bundled models' output), else as float64, so an answer
reads the same numbers either way. `rag eval` uses one with room for a whole evaluation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rag.answer.disk_vectors import DiskVectors
    from rag.backends.embedders import Embedder

# ~10 MB at 384 float32 dimensions (the default model), ~20 MB at 768: the sentences of ~400
# abstracts.
CAPACITY = 5_000
QUERY_CAPACITY = 256


class SentenceVectors:
    """An `Embedder` that remembers the vectors of the last `capacity` texts embedded with
    `truncate=True` (source sentences) and of the last `query_capacity` questions. Safe to share
    between threads."""

    def __init__(
        self,
        embedder: Embedder,
        capacity: int = CAPACITY,
        query_capacity: int = QUERY_CAPACITY,
        disk: DiskVectors | None = None,
    ) -> None:
        self.embedder = embedder
        self.disk = disk
        self.capacity = capacity
        self.query_capacity = query_capacity
        self._vectors: OrderedDict[str, Any] = OrderedDict()
        self._queries: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    @property
    def max_tokens(self) -> int | None:
        return self.embedder.max_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.embedder.count_tokens(texts)

    def embed_query(self, text: str) -> list[float]:
        # The model's own question vector, not `embed`'s: a model may embed questions differently
        # from documents (nomic-embed-text-v1.5's task prefixes).
        return self._remembered(
            self._queries,
            self.query_capacity,
            [text],
            lambda texts: [_compact(self.embedder.embed_query(t)) for t in texts],
        )[0]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        if not truncate:
            return self.embedder.embed(texts, truncate=False)
        return self._remembered(self._vectors, self.capacity, texts, self._kept_or_embedded)

    def _kept_or_embedded(self, texts: list[str]) -> list[Any]:
        """Each text's vector (a `_compact` array) from `disk`, the rest embedded and kept."""
        kept = self.disk.get(texts) if self.disk is not None else {}
        rest = [t for t in texts if t not in kept]
        if rest:
            fresh = {t: _compact(v) for t, v in zip(rest, self.embedder.embed(rest, truncate=True))}
            if self.disk is not None:
                self.disk.put(fresh)
            kept.update(fresh)
        return [kept[t] for t in texts]

    def _remembered(
        self,
        memo: OrderedDict[str, Any],
        capacity: int,
        texts: list[str],
        compute: Callable[[list[str]], Sequence[Any]],
    ) -> list[list[float]]:
        """Each text's vector from `memo`, the missing ones computed in one call (as `_compact`
        arrays) and remembered."""
        with self._lock:
            known = {t: memo[t] for t in dict.fromkeys(texts) if t in memo}
            for t in known:
                memo.move_to_end(t)
        missing = [t for t in dict.fromkeys(texts) if t not in known]
        if missing:
            fresh = dict(zip(missing, compute(missing)))
            known.update(fresh)
            with self._lock:
                memo.update(fresh)
                while len(memo) > capacity:
                    memo.popitem(last=False)
        return [known[t].tolist() for t in texts]


def _compact(vector: Any) -> Any:
    """The vector as a numpy array: float32 when that holds it exactly, else float64."""
    import numpy as np

    full = np.asarray(vector, dtype=np.float64)
    small = full.astype(np.float32)
    return small if np.array_equal(small, full) else full
