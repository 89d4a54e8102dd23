"""LlamaIndex, both ways, and the only module that imports `llama_index`: an app's LlamaIndex models
used as this project's (`LlamaIndexEmbedder`, `LlamaIndexChat`, picked by
`as_embedder`/`as_chat_model` for `RAG(embedder=, llm=)`), and the engine offered to LlamaIndex
(`RAG.retriever`, a `BaseRetriever`; `RAG.as_query_engine()`, a `BaseQueryEngine` that streams,
awaits, takes node postprocessors and emits LlamaIndex's instrumentation; `RAG.as_chat_engine()`, a
`BaseChatEngine`; `RAG.embed_model`, a `BaseEmbedding`). llama_index is a heavy import: every use
is inside a function.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from rag.backends.chat import (
    ChatModel,
    GenerationCancelled,
    Message,
    current_cancellation,
    read_in_thread,
    yes_share,
)
from rag.backends.embedders import Embedder
from rag.config import check_mode
from rag.errors import InputError, LLMError
from rag.markers import plain_text, reference_lines
from rag.text import count_tiktoken

if TYPE_CHECKING:  # the types RAG(embedder=, llm=) accepts, named for the engine's annotations
    from llama_index.core.base.embeddings.base import BaseEmbedding as BaseEmbedding
    from llama_index.core.llms import LLM as LLM

    from rag.models import Answer
    from rag.retrieve.search import Hit

__all__ = [
    "LlamaIndexChat",
    "LlamaIndexEmbedder",
    "as_chat_model",
    "as_embedder",
    "make_chat_engine",
    "make_embed_model",
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
#
# The classes subclass llama_index's and are made on first use (`_classes`): importing this module
# must not import llama_index.


def make_embed_model(rag) -> Any:
    """`RAG.embed_model`: the store's embedder as a LlamaIndex `BaseEmbedding` (the app's own model
    when it passed one in), so a LlamaIndex app queries this product's Chroma collection in the
    vector space that built it."""
    embedder = rag.embedder
    if isinstance(embedder, LlamaIndexEmbedder):
        return embedder.model
    return _classes().RagEmbedding(embedder)


def make_llamaindex_retriever(rag, k: int | None = None, mode: str | None = None) -> Any:
    """A LlamaIndex `BaseRetriever` over this index: one node per paper, its best chunk."""
    return _classes().PaperRetriever(rag, k, mode)


def hit_to_node(hit: Hit, node_cls: Any = None) -> Any:
    """A hit as a LlamaIndex node (a `TextNode` carrying the hit, so the query engine answers from
    the nodes a postprocessor leaves); its score is the cosine (as `Source.score`), and the metadata
    says what the order follows (`fused`, the node's place in the list) beside the keyword
    match."""
    scores = ["similarity", "fused", "keyword"]
    node = (node_cls or _classes().PaperNode)(
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
        excluded_embed_metadata_keys=["authors", "url", *scores, *NUMBERING],
        excluded_llm_metadata_keys=["authors", "url", *scores, *NUMBERING],
    )
    if hasattr(node, "_rag_hit"):
        node._rag_hit = hit
    return node


# Metadata the answer adds to its source nodes: the `[n]` and whether the text cites it.
NUMBERING = ["n", "cited"]


def make_query_engine(
    rag,
    streaming: bool = False,
    node_postprocessors: list | None = None,
    similarity_top_k: int | None = None,
) -> Any:
    """`RAG.as_query_engine(...)`: a LlamaIndex `BaseQueryEngine` (see `PaperQueryEngine`)."""
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    from rag.config import check_k

    if not isinstance(streaming, bool):
        raise InputError(f"streaming must be True or False, got {type(streaming).__name__}")
    post = list(node_postprocessors or [])
    bad = [type(p).__name__ for p in post if not isinstance(p, BaseNodePostprocessor)]
    if bad:
        raise InputError(
            f"node_postprocessors take LlamaIndex BaseNodePostprocessor objects, got {bad[0]}"
        )
    k = None if similarity_top_k is None else check_k(similarity_top_k)
    return _classes().PaperQueryEngine(rag, streaming, post, k)


def make_chat_engine(rag) -> Any:
    """`RAG.as_chat_engine()`: a LlamaIndex `BaseChatEngine` (see `PaperChatEngine`)."""
    return _classes().PaperChatEngine(rag)


class PlainPieces:
    """An answer stream's text as a reader sees it (`plain_text`), piece by piece: empty status
    pieces (`Reading`, `Writing`, a worker's idle ticks) give nothing, and backslashes at a piece's
    end wait for the next piece (an escaped bracket may be split between two)."""

    def __init__(self) -> None:
        self._carry = ""

    def feed(self, piece: str | None) -> str:
        if not piece:
            return ""
        text = self._carry + piece
        kept = text.rstrip("\\")
        self._carry = text[len(kept) :]
        return plain_text(kept) if kept else ""

    def end(self) -> str:
        carry, self._carry = self._carry, ""
        return plain_text(carry) if carry else ""


def text_pieces(pieces: Iterable[str | None]) -> Iterator[str]:
    """The non-empty pieces of `PlainPieces` over a stream's pieces."""
    plain = PlainPieces()
    for piece in pieces:
        text = plain.feed(piece)
        if text:
            yield text
    tail = plain.end()
    if tail:
        yield tail


async def atext_pieces(stream: Any) -> AsyncIterator[str]:
    """`text_pieces` of an `AnswerStream` for an event loop: a worker thread reads the stream
    (`read_in_thread`), so the loop never blocks on the model; leaving early cancels the
    answer."""
    reader: Any = read_in_thread(stream)  # a generator: closing it cancels the answer
    plain = PlainPieces()
    try:
        while True:
            piece = await asyncio.to_thread(next, reader, _END)
            if piece is _END:
                break
            text = plain.feed(piece)
            if text:
                yield text
    finally:
        with contextlib.suppress(ValueError):  # still running in its worker: it ends by itself
            reader.close()
    tail = plain.end()
    if tail:
        yield tail


_END: Any = object()


def references_piece(answer: Answer) -> str:
    """The text after an answer's own: its references, for readers of text alone (an agent's LLM
    reading `[1]` in a tool's output sees only the text, not the source nodes)."""
    lines = reference_lines(answer)
    return "\n\n" + "\n".join(lines) if lines else ""


def answer_text(answer: Answer) -> str:
    """What a LlamaIndex response says: the answer as plain text, then its references."""
    return plain_text(answer.answer) + references_piece(answer)


def source_nodes(answer: Answer, nodes: list[Any] | None = None) -> list[Any]:
    """The answer's sources as nodes in `[n]` order (cited 1..m, then the others), each with `n`
    and `cited` in its metadata: the given nodes (a query engine's, with their scores), matched by
    paper; else nodes made from the sources (text: the passage shown)."""
    from llama_index.core.schema import NodeWithScore, TextNode

    by_paper = {n.node.metadata.get("paper_id"): n for n in nodes or []}
    out = []
    for s in sorted(answer.sources, key=lambda s: s.n):
        found = by_paper.get(s.paper_id)
        if found is not None:
            node = found.node.model_copy()
            node.metadata = {**found.node.metadata, "n": s.n, "cited": s.cited}
            out.append(NodeWithScore(node=node, score=found.score))
        elif nodes is None:
            node = TextNode(
                id_=f"{s.paper_id}#{s.n}",
                text=s.passage,
                metadata={
                    "paper_id": s.paper_id,
                    "title": s.title,
                    "url": s.url or "",
                    "n": s.n,
                    "cited": s.cited,
                },
                excluded_embed_metadata_keys=["url", *NUMBERING],
                excluded_llm_metadata_keys=["url", *NUMBERING],
            )
            out.append(NodeWithScore(node=node, score=s.score))
    return out


@functools.cache
def _classes() -> Any:
    """The LlamaIndex subclasses, made once on first use (llama_index is a heavy import)."""
    import llama_index.core.instrumentation as instrument
    from llama_index.core.base.base_query_engine import BaseQueryEngine
    from llama_index.core.base.base_retriever import BaseRetriever
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.base.llms.types import ChatMessage, ChatResponse
    from llama_index.core.base.response.schema import (
        AsyncStreamingResponse,
        Response,
        StreamingResponse,
    )
    from llama_index.core.bridge.pydantic import PrivateAttr
    from llama_index.core.chat_engine.types import (
        AgentChatResponse,
        BaseChatEngine,
        StreamingAgentChatResponse,
    )
    from llama_index.core.instrumentation.events.synthesis import (
        SynthesizeEndEvent,
        SynthesizeStartEvent,
    )
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    dispatcher = instrument.get_dispatcher(__name__)

    class PaperNode(TextNode):
        """A retrieved chunk as a `TextNode`, carrying its hit (private: not serialised)."""

        _rag_hit: Any = PrivateAttr(default=None)

    class RagEmbedding(BaseEmbedding):
        """This product's embedder as a LlamaIndex `BaseEmbedding`. Texts longer than the model's
        window are refused, not cut (split them first, e.g. with `SentenceSplitter`)."""

        _embedder: Any = PrivateAttr()

        def __init__(self, embedder: Embedder) -> None:
            super().__init__(model_name=embedder.model_id)
            self._embedder = embedder

        @classmethod
        def class_name(cls) -> str:
            return "RagEmbedding"

        def _get_query_embedding(self, query: str) -> list[float]:
            return self._embedder.embed_query(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return await asyncio.to_thread(self._get_query_embedding, query)

        def _get_text_embedding(self, text: str) -> list[float]:
            return self._get_text_embeddings([text])[0]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            try:
                return self._embedder.embed(list(texts))
            except ValueError as exc:  # the ONNX embedder's "more than N word pieces"
                raise InputError(
                    f"{exc}: the embedder reads {self._embedder.max_tokens} word pieces; split the"
                    " texts first (e.g. SentenceSplitter(chunk_size=200))"
                ) from None

    class PaperRetriever(BaseRetriever):
        """Hybrid (BM25 + dense, RRF) paper retriever: one node per paper, its best chunk."""

        def __init__(self, rag: Any, k: int | None, mode: str | None) -> None:
            super().__init__()
            self._rag = rag
            self.k = k or rag.settings.top_k
            self.mode = check_mode(mode or rag.settings.mode)

        def retrieve(self, str_or_query_bundle: Any) -> list[NodeWithScore]:
            # LlamaIndex would wrap anything in a QueryBundle and fail deep inside with a
            # ValidationError.
            if not isinstance(str_or_query_bundle, (str, QueryBundle)):
                raise InputError(
                    f"the question must be text, got {type(str_or_query_bundle).__name__}"
                )
            return super().retrieve(str_or_query_bundle)

        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            hits = self._rag._retrieve(query_bundle.query_str, self.k, self.mode, scored=False)
            return [NodeWithScore(node=hit_to_node(h), score=h.score) for h in hits]

    class PaperQueryEngine(BaseQueryEngine):
        """Answers with numbered citations, from the papers its retriever finds and its node
        postprocessors leave (`retrieve`, then `synthesize`: each a LlamaIndex span, with the
        retrieval and synthesis events). The response's text is the answer then its references;
        `source_nodes` are the sources in `[n]` order (`n`, `cited` in their metadata) and
        `metadata['answer']` is the full `Answer`. Streaming: `response_gen` yields the text, and
        `source_nodes` and `metadata['answer']` are filled when it ends (before: the nodes in
        retrieval order). `aquery` runs the blocking work in worker threads. Nodes a postprocessor
        adds from elsewhere (not this index's) are left out of the answer."""

        def __init__(
            self, rag: Any, streaming: bool, node_postprocessors: list, k: int | None
        ) -> None:
            super().__init__(callback_manager=None)
            self._rag = rag
            self.streaming = streaming
            self.node_postprocessors = node_postprocessors
            self.retriever = PaperRetriever(rag, k, None)

        def _get_prompt_modules(self) -> dict:
            return {}

        def retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            nodes = self.retriever.retrieve(query_bundle)
            for post in self.node_postprocessors:
                nodes = post.postprocess_nodes(nodes, query_bundle=query_bundle)
            return nodes

        def _answer_stream(self, query_bundle: QueryBundle, nodes: list) -> tuple[Any, list]:
            """The answer from the nodes of this index among `nodes` (a paper once), and those."""
            hits, kept, seen = [], [], set()
            for n in nodes:
                hit = getattr(n.node, "_rag_hit", None)
                if hit is None or hit.paper.paper_id in seen:
                    continue
                seen.add(hit.paper.paper_id)
                hits.append(hit)
                kept.append(n)
            return self._rag._stream_from_hits(query_bundle.query_str, hits), kept

        @dispatcher.span
        def synthesize(
            self,
            query_bundle: QueryBundle,
            nodes: list[NodeWithScore],
            additional_source_nodes: Any = None,
        ) -> Any:
            dispatcher.event(SynthesizeStartEvent(query=query_bundle))
            stream, kept = self._answer_stream(query_bundle, nodes)
            response: Any
            if self.streaming:
                response = StreamingResponse(response_gen=None, source_nodes=list(kept))  # type: ignore[arg-type]
                response.metadata = {}
                response.response_gen = self._streamed(stream, kept, response)
            else:
                answer = stream.answer
                response = Response(
                    response=answer_text(answer),
                    source_nodes=source_nodes(answer, kept),
                    metadata={"answer": answer},
                )
            dispatcher.event(SynthesizeEndEvent(query=query_bundle, response=response))
            return response

        @staticmethod
        def _streamed(stream: Any, kept: list, response: Any) -> Iterator[str]:
            yield from text_pieces(stream)
            answer = stream.answer
            response.source_nodes[:] = source_nodes(answer, kept)
            response.metadata["answer"] = answer
            tail = references_piece(answer)
            if tail:
                yield tail

        def _query(self, query_bundle: QueryBundle) -> Any:
            return self.synthesize(query_bundle, self.retrieve(query_bundle))

        async def _aquery(self, query_bundle: QueryBundle) -> Any:
            if not self.streaming:
                return await asyncio.to_thread(self._query, query_bundle)
            nodes = await asyncio.to_thread(self.retrieve, query_bundle)
            dispatcher.event(SynthesizeStartEvent(query=query_bundle))
            stream, kept = await asyncio.to_thread(self._answer_stream, query_bundle, nodes)
            response = AsyncStreamingResponse(response_gen=None, source_nodes=list(kept))  # type: ignore[arg-type]
            response.metadata = {}

            async def streamed() -> AsyncGenerator[str, None]:
                async for text in atext_pieces(stream):
                    yield text
                answer = stream.answer
                response.source_nodes[:] = source_nodes(answer, kept)
                response.metadata["answer"] = answer  # type: ignore[index]
                tail = references_piece(answer)
                if tail:
                    yield tail

            response.response_gen = streamed()
            dispatcher.event(SynthesizeEndEvent(query=query_bundle, response=response))
            return response

    class PaperChatEngine(BaseChatEngine):
        """A conversation over the papers: each message is answered as `RAG.chat` answers it (a
        follow-up rewritten into a standalone question from the history), with the response text,
        `source_nodes` and `metadata['answer']` of `PaperQueryEngine`. The history is kept here
        (`chat_history`, `reset`); a `chat_history` passed to a call replaces it. A streamed
        reply's `source_nodes` are filled when its stream ends."""

        def __init__(self, rag: Any) -> None:
            self._rag = rag
            self._history: list[ChatMessage] = []
            self._lock = threading.Lock()

        def reset(self) -> None:
            with self._lock:
                self._history = []

        @property
        def chat_history(self) -> list[ChatMessage]:
            with self._lock:
                return list(self._history)

        def _start(self, message: str, chat_history: list[ChatMessage] | None) -> Any:
            if chat_history is not None:
                with self._lock:
                    self._history = list(chat_history)
            history = [
                {"role": str(getattr(m.role, "value", m.role)), "content": m.content or ""}
                for m in self.chat_history
            ]
            return self._rag.stream(message, history=history)

        def _remember(self, message: str, answer: Answer) -> None:
            with self._lock:
                self._history += [
                    ChatMessage(role="user", content=message),
                    ChatMessage(role="assistant", content=plain_text(answer.answer)),
                ]

        def chat(self, message: str, chat_history: list[ChatMessage] | None = None) -> Any:
            answer = self._start(message, chat_history).answer
            self._remember(message, answer)
            return AgentChatResponse(
                response=answer_text(answer),
                source_nodes=source_nodes(answer),
                metadata={"answer": answer},
            )

        async def achat(self, message: str, chat_history: list[ChatMessage] | None = None) -> Any:
            return await asyncio.to_thread(self.chat, message, chat_history)

        def _finish(self, stream: Any, message: str, response: Any) -> str:
            answer = stream.answer
            self._remember(message, answer)
            response.source_nodes[:] = source_nodes(answer)
            return references_piece(answer)

        def stream_chat(self, message: str, chat_history: list[ChatMessage] | None = None) -> Any:
            stream = self._start(message, chat_history)
            response = StreamingAgentChatResponse(is_writing_to_memory=False)

            def replies() -> Generator[ChatResponse, None, None]:
                text = ""
                for part in itertools.chain(text_pieces(stream), [None]):
                    piece = self._finish(stream, message, response) if part is None else part
                    text += piece
                    yield ChatResponse(
                        message=ChatMessage(role="assistant", content=text), delta=piece
                    )

            response.chat_stream = replies()
            return response

        async def astream_chat(
            self, message: str, chat_history: list[ChatMessage] | None = None
        ) -> Any:
            stream = await asyncio.to_thread(self._start, message, chat_history)
            response = StreamingAgentChatResponse(is_writing_to_memory=False)

            async def replies() -> AsyncGenerator[ChatResponse, None]:
                text = ""
                async for piece in atext_pieces(stream):
                    text += piece
                    yield ChatResponse(
                        message=ChatMessage(role="assistant", content=text), delta=piece
                    )
                tail = self._finish(stream, message, response)
                text += tail
                yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=tail)

            response.achat_stream = replies()
            return response

    return SimpleNamespace(
        PaperNode=PaperNode,
        RagEmbedding=RagEmbedding,
        PaperRetriever=PaperRetriever,
        PaperQueryEngine=PaperQueryEngine,
        PaperChatEngine=PaperChatEngine,
    )
