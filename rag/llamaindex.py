"""LlamaIndex, both ways, and the only module that imports `llama_index`: an app's LlamaIndex models
used as this project's (`LlamaIndexEmbedder`, `LlamaIndexChat`, picked by
`as_embedder`/`as_chat_model` for `RAG(embedder=, llm=)`), and the engine offered to LlamaIndex
(`RAG.retriever`, a `BaseRetriever`; `RAG.query_engine`, a `BaseQueryEngine`). llama_index is a
heavy import: every use is inside a function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rag.backends.chat import (
    ChatModel,
    GenerationCancelled,
    Message,
    current_cancellation,
    yes_share,
)
from rag.backends.embedders import Embedder
from rag.config import check_mode
from rag.errors import InputError, LLMError
from rag.text import count_tiktoken

if TYPE_CHECKING:  # the types RAG(embedder=, llm=) accepts, named for the engine's annotations
    from llama_index.core.base.embeddings.base import BaseEmbedding as BaseEmbedding
    from llama_index.core.llms import LLM as LLM

    from rag.retrieve.search import Hit

__all__ = [
    "LlamaIndexChat",
    "LlamaIndexEmbedder",
    "as_chat_model",
    "as_embedder",
    "make_llamaindex_retriever",
    "make_query_engine",
]


# ---- an app's LlamaIndex models, used here ----------------------------------------------------


def as_embedder(obj: object) -> Embedder:
    """An embedder passed in by an app (`RAG(embedder=...)`): anything with this module's `Embedder`
    methods, or a LlamaIndex `BaseEmbedding`."""
    if isinstance(obj, Embedder):
        return obj
    try:
        from llama_index.core.base.embeddings.base import BaseEmbedding
    except ImportError:  # pragma: no cover - llama-index-core is a dependency
        BaseEmbedding = ()  # type: ignore[assignment,misc]
    if isinstance(obj, BaseEmbedding):
        return LlamaIndexEmbedder(obj)
    raise InputError(
        f"embedder must be a LlamaIndex BaseEmbedding or have model_id, max_tokens, count_tokens, "
        f"embed and embed_query (see rag.Embedder); got {type(obj).__name__}"
    )


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


def as_chat_model(obj: object) -> ChatModel:
    """A chat model passed in by an app (`RAG(llm=...)`): anything with `ChatModel`'s methods, or a
    LlamaIndex `LLM`."""
    if isinstance(obj, ChatModel):
        return obj
    from llama_index.core.llms import LLM

    if isinstance(obj, LLM):
        return LlamaIndexChat(obj)
    raise InputError(
        "llm must be 'openai', 'local', 'none', a LlamaIndex LLM, or have label, check_model,"
        f" stream, complete, yes_probability and cost (see rag.ChatModel); got {type(obj).__name__}"
    )


class LlamaIndexChat:
    """A LlamaIndex `LLM` used as this project's `ChatModel` (`RAG(llm=...)`). Its failures become
    `LLMError`, so an answer falls back to quoting the sources as with the built-in backends; the
    answerability check reads its one-word reply (LlamaIndex exposes no log-probabilities)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @property
    def label(self) -> str:
        name = (
            getattr(getattr(self.model, "metadata", None), "model_name", None)
            or type(self.model).__name__
        )
        return f"LlamaIndex {type(self.model).__name__} ({name})"

    def check_model(self) -> None:
        return None

    def _messages(self, messages: list[Message]) -> list[Any]:
        from llama_index.core.llms import ChatMessage

        return [ChatMessage(role=m["role"], content=m["content"]) for m in messages]

    def _failed(self, exc: Exception) -> LLMError:
        return LLMError(
            f"the LLM passed in ({self.label}) failed: {type(exc).__name__}: {exc}; "
            "check that model's own configuration"
        )

    def stream(self, messages: list[Message]) -> Iterator[str]:
        cancel = current_cancellation()
        parts = None
        try:
            cancel.check()
            parts = self.model.stream_chat(self._messages(messages))
            for part in parts:
                cancel.check()
                if part.delta:
                    yield part.delta
        except GenerationCancelled:
            raise
        except Exception as exc:  # any provider's error type: the answer falls back to quotes
            raise self._failed(exc) from None
        finally:
            close = getattr(parts, "close", None)
            if close is not None:
                close()

    def complete(self, messages: list[Message]) -> str:
        try:
            return str(self.model.chat(self._messages(messages)).message.content or "")
        except Exception as exc:  # as in stream
            raise self._failed(exc) from None

    def yes_probability(self, messages: list[Message]) -> float:
        return yes_share([], self.complete(messages))

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return None


# ---- this engine, offered to LlamaIndex -------------------------------------------------------


def make_llamaindex_retriever(rag, k: int | None = None, mode: str | None = None):
    """A LlamaIndex `BaseRetriever` over this index (built lazily: llama_index is a heavy
    import)."""
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    class PaperRetriever(BaseRetriever):
        """Hybrid (BM25 + dense, RRF) paper retriever: one node per paper, its best chunk."""

        def __init__(self) -> None:
            super().__init__()
            self.k = k or rag.settings.top_k
            self.mode = check_mode(mode or rag.settings.mode)

        def retrieve(self, str_or_query_bundle) -> list[NodeWithScore]:
            # LlamaIndex would wrap anything in a QueryBundle and fail deep inside with a
            # ValidationError.
            if not isinstance(str_or_query_bundle, (str, QueryBundle)):
                raise InputError(
                    f"the question must be text, got {type(str_or_query_bundle).__name__}"
                )
            return super().retrieve(str_or_query_bundle)

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            hits = rag._retrieve(query_bundle.query_str, k=self.k, mode=self.mode)
            return [NodeWithScore(node=hit_to_node(h, TextNode), score=h.score) for h in hits]

    return PaperRetriever()


def hit_to_node(hit: Hit, node_cls):
    """A hit as a LlamaIndex node; its score is the cosine (as `Source.score`), and the metadata
    says what the order follows (`fused`, the node's place in the list) beside the keyword match."""
    scores = ["similarity", "fused", "keyword"]
    return node_cls(
        id_=hit.chunk.chunk_id,
        text=hit.chunk.text,
        metadata={
            "paper_id": hit.paper.paper_id,
            "title": hit.paper.display_title,
            "authors": ", ".join(hit.paper.authors),
            "url": hit.paper.url or "",
            "similarity": hit.similarity,
            "fused": hit.fused,
            "keyword": hit.keyword,
        },
        excluded_embed_metadata_keys=["authors", "url", *scores],
        excluded_llm_metadata_keys=["authors", "url", *scores],
    )


def make_query_engine(rag):
    from llama_index.core.base.response.schema import Response
    from llama_index.core.query_engine import CustomQueryEngine
    from llama_index.core.schema import NodeWithScore, TextNode

    from rag.answer.citations import plain_text, reference_lines

    class PaperQueryEngine(CustomQueryEngine):
        """Answers with numbered citations; `response.metadata['answer']` is the full `Answer`."""

        rag: Any

        def custom_query(self, query_str: str):
            answer = self.rag.ask(query_str)
            nodes = [
                NodeWithScore(
                    node=TextNode(
                        id_=f"{s.paper_id}#{s.n}",
                        text=s.passage,
                        metadata={
                            "paper_id": s.paper_id,
                            "title": s.title,
                            "n": s.n,
                            "cited": s.cited,
                            "url": s.url or "",
                        },
                    ),
                    score=s.score,
                )
                for s in answer.sources
            ]
            # The text carries its references: an agent's LLM reading `[1]` in a tool's output
            # sees only this text, not the source nodes.
            text = "\n\n".join(
                [plain_text(answer.answer), "\n".join(reference_lines(answer))]
            ).strip()
            return Response(response=text, source_nodes=nodes, metadata={"answer": answer})

    return PaperQueryEngine(rag=rag)
