"""A memo around a real embedding model, for tests that ask many questions over the same few
abstracts.

Answering embeds every sentence of each retrieved abstract, per question (to pick what the model
reads, to decide which codes an answer may repeat, to check support, to rank extractive quotes): the
170 answers of tests/test_injection.py ask for 8,896 embeddings of 963 distinct texts, and computing
them was most of its two answer tests' time. `MemoEmbedder(real)` embeds each distinct text once
with the real model and reuses its vector. Plumbing, not a fake: every vector comes from the wrapped
model. One difference, below what any check can see: a reused vector was computed in another batch,
and the int8 all-MiniLM-L6-v2 gives a sentence embedded alone and in a batch vectors at cosine >=
0.9999998 (20 poisoned abstracts); the 85 extractive answers of tests/test_injection.py are
identical with and without the memo (measured when this was written).
"""

from __future__ import annotations

import threading


class MemoEmbedder:
    """`RAG(embedder=MemoEmbedder(make_embedder(settings)))`: the wrapped model's id, window and
    token counts; `embed` and `embed_query` computed once per distinct (text, truncate) and then
    reused. `hits` and `misses` count texts served from the memo and texts sent to the model."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.hits = self.misses = 0
        self._texts: dict[tuple[str, bool], list[float]] = {}
        self._queries: dict[str, list[float]] = {}
        # a RAG may be shared between threads: the counts are read-modify-write
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def max_tokens(self) -> int | None:
        return self.inner.max_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if (t, truncate) not in self._texts]
            self.misses += len(missing)
            self.hits += len(texts) - len(missing)
        if missing:
            for text, vector in zip(missing, self.inner.embed(missing, truncate=truncate)):
                self._texts[(text, truncate)] = list(vector)
        return [list(self._texts[(t, truncate)]) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        with self._lock:
            known = text in self._queries
            self.hits += known
            self.misses += not known
        if not known:
            self._queries[text] = list(self.inner.embed_query(text))
        return list(self._queries[text])
