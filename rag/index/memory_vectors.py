"""Vectors held in memory, for tests: exact cosine search over a numpy matrix, with no Chroma and no
files. `Store(settings, vectors=MemoryVectors())` uses them; they last as long as the object (a
store closed and opened again keeps them, a new `Store` starts empty)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.index.vectors import ChunkIds, Vectors


class MemoryVectors(Vectors):
    """Chunk id -> float32 vector; searches stack them into a matrix (kept until a write)."""

    def __init__(self) -> None:
        self._vectors: dict[str, np.ndarray] = {}
        self._stacked: tuple[list[str], np.ndarray] | None = None  # ids and unit rows, for search
        self._lock = threading.Lock()

    def write(
        self, chunks: Sequence[ChunkIds], vectors: list[list[float]], papers: Sequence[Any] = ()
    ) -> None:
        with self._lock:
            for chunk, vector in zip(chunks, vectors):
                self._vectors[chunk.chunk_id] = np.asarray(vector, dtype=np.float32)
            self._stacked = None

    def drop(self) -> None:
        with self._lock:
            self._vectors, self._stacked = {}, None

    def count(self) -> int:
        return len(self._vectors)

    def _unit_rows(self) -> tuple[list[str], np.ndarray]:
        with self._lock:
            if self._stacked is None:
                ids = list(self._vectors)
                if not ids:
                    return ids, np.zeros((0, 0), np.float32)
                m = np.stack([self._vectors[i] for i in ids])
                self._stacked = ids, m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
            return self._stacked

    def search(self, vector: list[float], n: int) -> list[tuple[str, float]]:
        ids, unit = self._unit_rows()
        if not ids or n <= 0:
            return []
        q = np.asarray(vector, dtype=np.float32)
        sims = unit @ (q / max(float(np.linalg.norm(q)), 1e-12))
        best = np.argsort(-sims, kind="stable")[:n]
        return [(ids[i], float(sims[i])) for i in best]

    def fetch(self, chunk_ids: list[str]) -> tuple[list[str], np.ndarray]:
        with self._lock:
            found = [cid for cid in dict.fromkeys(chunk_ids) if cid in self._vectors]
            rows = [self._vectors[cid] for cid in found]
        return found, np.stack(rows) if rows else np.zeros((0, 0), np.float32)
