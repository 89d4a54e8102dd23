"""A LlamaIndex `BaseEmbedding` used as this project's `Embedder` (`RAG(embedder=...)`): an app that
already has one (HuggingFace, Ollama, Azure...) indexes and asks with it, no adapter of its own."""

from __future__ import annotations

from typing import Any

from rag.index.chunking import count_tiktoken


class LlamaIndexEmbedder:
    """Wraps a LlamaIndex embedding model. Vectors are normalised to unit length (the index and the
    support check compare by dot product); tokens are counted with tiktoken, as the model's own
    tokenizer is not exposed, and chunks are cut to MINILM_MAX_TOKENS of them."""

    max_tokens: int | None = None

    def __init__(self, model: Any) -> None:
        self.model = model
        name = getattr(model, "model_name", None) or type(model).__name__
        # Recorded in the index: another model later is refused instead of mixing vector spaces.
        self.model_id = f"llamaindex:{type(model).__name__}:{name}"

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [count_tiktoken(t) for t in texts]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        return [_unit(v) for v in self.model.get_text_embedding_batch(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        return _unit(self.model.get_query_embedding(text))


def _unit(vector: list[float]) -> list[float]:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector] if norm else list(vector)
