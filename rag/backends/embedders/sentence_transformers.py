"""Any sentence-transformers model (RAG_EMBED_MODEL=st:<name-or-path>, the optional extra `[st]`):
`SentenceTransformersEmbedder`. Imports sentence-transformers, and with it torch, only when one is
made.

This module shares its name with the `sentence_transformers` package. Imports in Python 3 are
absolute, so `from sentence_transformers import ...` below is the real package, never this file;
rag's own modules are named in full (`rag.errors`) to keep that visible. Do not run this file as a
script or put rag/backends/embedders/ on sys.path: then this file would shadow the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.errors import StoreError

if TYPE_CHECKING:
    from rag.config import Settings


class SentenceTransformersEmbedder:
    """Any sentence-transformers model (optional extra `[st]`; imports torch)."""

    def __init__(self, settings: Settings) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise StoreError(
                "sentence-transformers models need the extra: pip install -e '.[st]'"
            ) from None
        self.model_id = settings.embed_model
        self._model = SentenceTransformer(settings.embed_model.split(":", 1)[1], device="cpu")
        self.max_tokens = self._model.max_seq_length

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._model.tokenizer(texts)["input_ids"]]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        return self._model.encode(texts, normalize_embeddings=True, batch_size=32).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]
