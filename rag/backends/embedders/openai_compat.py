"""OpenAI or any OpenAI-compatible `/v1/embeddings` endpoint (RAG_EMBED_MODEL=openai:<model>):
`OpenAIEmbedder`. The `openai` client and numpy are imported only when one is made or used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag.errors import LLMError

if TYPE_CHECKING:
    from rag.config import Settings


class OpenAIEmbedder:
    """OpenAI or any OpenAI-compatible `/v1/embeddings` endpoint, through the `openai` client.

    Vectors are L2-normalised; an endpoint that returns one vector per token (llama.cpp's server
    for a model without pooling) is mean-pooled.
    """

    batch_size = 64
    # The endpoint's window is not known here: chunks are cut to MINILM_MAX_TOKENS of tiktoken's
    # count.
    max_tokens: int | None = None

    def __init__(self, settings: Settings) -> None:
        import openai

        self.model_id = settings.embed_model
        self._model = settings.embed_model.split(":", 1)[1]
        self._client = openai.OpenAI(
            base_url=settings.embed_base_url
            or settings.openai_base_url
            or "https://api.openai.com/v1",
            api_key=settings.openai_api_key or "not-needed",
            timeout=settings.llm_timeout,
            max_retries=settings.llm_retries,
        )

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens per text by tiktoken (the endpoint's own tokenizer is not known here)."""
        from rag.text import count_tiktoken

        return [count_tiktoken(t) for t in texts]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        """Unit vectors, `batch_size` texts per request; `truncate` is ignored: texts go to the
        endpoint whole."""
        import numpy as np

        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            try:
                resp = self._client.embeddings.create(
                    model=self._model, input=texts[start : start + self.batch_size]
                )
            except Exception as exc:  # connection, auth, unknown model...: one clear line
                raise LLMError(
                    f"the embeddings endpoint failed ({type(exc).__name__}); check RAG_EMBED_MODEL,"
                    " RAG_EMBED_BASE_URL/OPENAI_BASE_URL and OPENAI_API_KEY"
                ) from None
            for item in sorted(resp.data, key=lambda d: d.index):
                vec = np.asarray(item.embedding, dtype=np.float32)
                if vec.ndim == 2:
                    vec = vec.mean(axis=0)
                out.append((vec / max(float(np.linalg.norm(vec)), 1e-12)).tolist())
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]
