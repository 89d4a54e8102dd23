"""The engine inside a LlamaIndex app (issue 51, item 1): `RAG.as_query_engine()` streams, awaits,
takes node postprocessors, keeps its citations as data and is traced by LlamaIndex's
instrumentation; `RAG.as_chat_engine()` chats; LlamaIndex's own classes (RetrieverQueryEngine,
QueryEngineTool in a FunctionAgent, FaithfulnessEvaluator, RetrieverEvaluator) run on them.

Plumbing tests: the product's fake models (rag.testing's HashEmbedder and ScriptedChat) stand in
for the embedder and the answer's LLM, and LlamaIndex's mock LLMs (or a scripted CustomLLM) for the
app's, so no model loads and nothing leaves the machine. What is asserted is the wiring (what
reaches LlamaIndex, in what order, in which thread), not answer quality.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from rag import RAG
from rag.errors import InputError
from rag.testing import HashEmbedder, ScriptedChat

PALIMPSA = "How does Palimpsa relate to Mamba2?"
PALIMPSA_ID = "wKMV7mXjUr"
REPLY = "Palimpsa treats Mamba2 as a special case [1]."


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The 76 seed papers embedded by HashEmbedder (about a second)."""
    path = tmp_path_factory.mktemp("li_engine") / "store"
    RAG(store_dir=path, embedder=HashEmbedder(), llm="none").ingest()
    return path


@pytest.fixture(scope="module")
def rag(store):
    return RAG(
        store_dir=store, embedder=HashEmbedder(), llm=ScriptedChat(REPLY), answer_style="free"
    )


def _slow_reply(seconds: float):
    def reply(messages):
        time.sleep(seconds)
        return REPLY

    return reply


# ---- the query engine -------------------------------------------------------------------------


def test_query_engine_is_the_default_of_as_query_engine(rag):
    from llama_index.core.base.base_query_engine import BaseQueryEngine
    from llama_index.core.base.response.schema import Response

    response = rag.query_engine.query(PALIMPSA)
    assert isinstance(rag.query_engine, BaseQueryEngine) and isinstance(response, Response)
    answer = response.metadata["answer"]
    assert str(response).startswith(REPLY) and "References:" in str(response)
    # The citations as data: the source nodes in [n] order, each with its n and whether it's cited.
    assert (
        [n.node.metadata["n"] for n in response.source_nodes]
        == [s.n for s in answer.sources]
        == list(range(1, len(answer.sources) + 1))
    )
    first = response.source_nodes[0].node
    assert first.metadata["paper_id"] == PALIMPSA_ID and first.metadata["cited"] is True
    assert first.metadata["title"] in str(response) and first.get_content()  # the passage


def test_streaming_yields_the_text_then_fills_in_the_citations(rag):
    from llama_index.core.base.response.schema import StreamingResponse

    whole = str(rag.query_engine.query(PALIMPSA))
    response = rag.as_query_engine(streaming=True).query(PALIMPSA)
    assert isinstance(response, StreamingResponse)
    retrieved = [n.node.metadata["paper_id"] for n in response.source_nodes]
    assert retrieved and "answer" not in response.metadata  # nothing answered yet
    pieces = list(response.response_gen)
    # No empty status pieces (Reading, Writing) reach LlamaIndex; joined, the pieces are the text.
    assert pieces and all(pieces) and "".join(pieces) == whole
    answer = response.metadata["answer"]
    assert [n.node.metadata["paper_id"] for n in response.source_nodes] == [
        s.paper_id for s in answer.sources
    ]
    assert sorted(retrieved) == sorted(s.paper_id for s in answer.sources)


def test_extractive_answers_stream_too(store):
    plain = RAG(store_dir=store, embedder=HashEmbedder(), llm="none")
    response = plain.as_query_engine(streaming=True).query(PALIMPSA)
    text = "".join(response.response_gen)
    assert response.metadata["answer"].mode == "extractive"
    assert text == str(plain.query_engine.query(PALIMPSA))


def test_aquery_leaves_the_event_loop_free(store):
    """A model taking 0.6 s to reply: the loop keeps ticking while `aquery` waits for it, in both
    the plain and the streaming response."""
    slow = RAG(
        store_dir=store,
        embedder=HashEmbedder(),
        llm=ScriptedChat(_slow_reply(0.6)),
        answer_style="free",
    )

    async def run(streaming: bool):
        ticks = 0
        stop = asyncio.Event()

        async def tick():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.02)

        ticker = asyncio.create_task(tick())
        response = await slow.as_query_engine(streaming=streaming).aquery(PALIMPSA)
        text = (
            "".join([p async for p in response.async_response_gen()])
            if streaming
            else str(response)
        )
        stop.set()
        await ticker
        return ticks, text, response

    for streaming in (False, True):
        ticks, text, response = asyncio.run(run(streaming))
        assert ticks >= 10, (streaming, ticks)  # 0.6 s at a 20 ms tick: ~30 when never blocked
        assert text.startswith(REPLY) and response.metadata["answer"].sources[0].n == 1


def test_a_postprocessor_runs_between_retrieval_and_the_answer(rag):
    """A user's reranker (here: keeps the papers it is told, best first) decides what the answer
    reads; LlamaIndex's own SimilarityPostprocessor composes with it."""
    from llama_index.core.postprocessor import SimilarityPostprocessor
    from llama_index.core.postprocessor.types import BaseNodePostprocessor

    retrieved = [n.node.metadata["paper_id"] for n in rag.retriever.retrieve(PALIMPSA)]
    keep = retrieved[1:3][::-1]  # drops the best paper, reverses two others

    class Rerank(BaseNodePostprocessor):
        seen: list = []

        def _postprocess_nodes(self, nodes, query_bundle=None):
            self.seen.append((query_bundle.query_str, [n.node.metadata["paper_id"] for n in nodes]))
            by_id = {n.node.metadata["paper_id"]: n for n in nodes}
            return [by_id[i] for i in keep]

    rerank = Rerank()
    engine = rag.as_query_engine(
        node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=-1.0), rerank]
    )
    answer = engine.query(PALIMPSA).metadata["answer"]
    assert rerank.seen == [(PALIMPSA, retrieved)]
    assert sorted(s.paper_id for s in answer.sources) == sorted(keep)
    assert PALIMPSA_ID not in {s.paper_id for s in answer.sources}
    # The reranked order is the order the answer numbers its uncited sources in.
    assert [s.paper_id for s in answer.sources if not s.cited] == [
        i for i in keep if i in {s.paper_id for s in answer.sources if not s.cited}
    ]


def test_similarity_top_k_and_bad_arguments(rag):
    response = rag.as_query_engine(similarity_top_k=2).query(PALIMPSA)
    assert len(response.source_nodes) == 2
    with pytest.raises(InputError, match="k must be between 1 and 100"):
        rag.as_query_engine(similarity_top_k=0)
    with pytest.raises(InputError, match="BaseNodePostprocessor"):
        rag.as_query_engine(node_postprocessors=[lambda nodes: nodes])


def test_instrumentation_sees_retrieval_and_the_answer(rag):
    """A LlamaIndex event handler and span handler (what Langfuse and Phoenix plug in) on the root
    dispatcher see the query, its retrieval and its answer, the last two inside the first."""
    import llama_index.core.instrumentation as instrument
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler

    class Events(BaseEventHandler):
        names: list = []

        def handle(self, event, **kwargs):
            self.names.append((event.class_name(), event.span_id))

    root = instrument.get_dispatcher()
    events, spans = Events(), SimpleSpanHandler()
    root.add_event_handler(events)
    root.add_span_handler(spans)
    try:
        rag.query_engine.query(PALIMPSA)
        streamed = rag.as_query_engine(streaming=True).query(PALIMPSA)
        "".join(streamed.response_gen)
    finally:
        root.event_handlers.remove(events)
        root.span_handlers.remove(spans)
    names = [name for name, _ in events.names]
    for expected in (
        "QueryStartEvent",
        "RetrievalStartEvent",
        "RetrievalEndEvent",
        "SynthesizeStartEvent",
        "SynthesizeEndEvent",
        "QueryEndEvent",
    ):
        assert names.count(expected) == 2, (expected, names)
    assert names.index("RetrievalEndEvent") < names.index("SynthesizeStartEvent")
    done = {s.id_: s for s in spans.completed_spans}

    def under(span_id, name):
        """Whether the span `span_id` is inside a span named `name`."""
        parent = done[span_id].parent_id
        while parent is not None and parent in done:
            if parent.startswith(name + "-"):
                return True
            parent = done[parent].parent_id
        return False

    kinds = {i.split("-")[0] for i in done}
    assert {"PaperRetriever.retrieve", "PaperQueryEngine.synthesize"} <= kinds
    for span_id in done:
        if span_id.startswith(("PaperRetriever.retrieve-", "PaperQueryEngine.synthesize-")):
            assert under(span_id, "PaperQueryEngine.query"), span_id


# ---- LlamaIndex's own classes on them ----------------------------------------------------------


def test_retriever_query_engine_over_the_retriever(rag):
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    engine = RetrieverQueryEngine.from_args(rag.retriever, llm=MockLLM())
    response = engine.query(PALIMPSA)
    assert response.source_nodes[0].node.metadata["paper_id"] == PALIMPSA_ID
    # MockLLM echoes its prompt: the passages LlamaIndex put in it are this index's, titles first.
    assert response.source_nodes[0].node.get_content() in str(response)


# LlamaIndex's workflow reads its models' deprecated pydantic attributes (its warnings, not ours).
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("streaming", [False, True])
def test_query_engine_tool_in_a_function_agent(rag, streaming):
    """LlamaIndex's FunctionAgent, its LLM LlamaIndex's MockFunctionCallingLLM with a script: call
    the tool with the question, then answer with what the tool said."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
    from llama_index.core.llms.mock import MockFunctionCallingLLM
    from llama_index.core.tools import QueryEngineTool

    def script(messages, **kwargs):
        said = [m for m in messages if m.role == MessageRole.TOOL]
        if said:
            return ChatMessage(role="assistant", content=f"The papers say: {said[-1].content}")
        call = ToolCallBlock(tool_call_id="1", tool_name="papers", tool_kwargs={"input": PALIMPSA})
        return ChatMessage(role="assistant", blocks=[call])

    tool = QueryEngineTool.from_defaults(
        rag.as_query_engine(streaming=streaming), name="papers", description="ML papers"
    )
    agent = FunctionAgent(
        tools=[tool], llm=MockFunctionCallingLLM(response_generator=script), streaming=False
    )

    async def run():
        return await agent.run(user_msg=PALIMPSA)

    result = asyncio.run(run())
    text = str(result)
    assert text.startswith("The papers say: ") and REPLY in text
    assert "Learning to Remember, Learn, and Forget in Attention-Based Models" in text
    (call,) = result.tool_calls
    assert call.tool_name == "papers" and call.tool_output.raw_output.metadata["answer"].sources


def _yes_llm():
    """A LlamaIndex LLM that answers YES and keeps the prompts it was given."""
    from llama_index.core.llms import CompletionResponse, CustomLLM, LLMMetadata

    class YesLLM(CustomLLM):
        prompts: list = []

        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(model_name="scripted-yes")

        def complete(self, prompt, formatted=False, **kwargs):
            self.prompts.append(prompt)
            return CompletionResponse(text="YES")

        def stream_complete(self, prompt, formatted=False, **kwargs):
            yield self.complete(prompt)

    return YesLLM()


def test_faithfulness_evaluator_reads_the_cited_passages(rag):
    from llama_index.core.evaluation import FaithfulnessEvaluator

    llm = _yes_llm()
    response = rag.query_engine.query(PALIMPSA)
    result = FaithfulnessEvaluator(llm=llm).evaluate_response(response=response)
    assert result.passing and result.contexts == [
        n.node.get_content() for n in response.source_nodes
    ]
    # The judge read the answer and the cited passage.
    assert any(REPLY in p for p in llm.prompts)
    cited = response.source_nodes[0].node.get_content()
    assert any(cited[:80] in p for p in llm.prompts)


def test_retriever_evaluator_scores_the_retriever(rag):
    from llama_index.core.evaluation import RetrieverEvaluator

    gold = [cid for _, cid, pid in rag.store.chunk_papers_after(-1) if pid == PALIMPSA_ID]
    evaluator = RetrieverEvaluator.from_metric_names(["hit_rate", "mrr"], retriever=rag.retriever)
    result = evaluator.evaluate(query=PALIMPSA, expected_ids=gold)
    assert result.metric_vals_dict == {"hit_rate": 1.0, "mrr": 1.0}


# ---- the chat engine ---------------------------------------------------------------------------


def test_chat_engine_follows_up_as_rag_chat_does(rag):
    from llama_index.core.chat_engine.types import AgentChatResponse, BaseChatEngine

    engine = rag.as_chat_engine()
    assert isinstance(engine, BaseChatEngine)
    first = engine.chat("What is Palimpsa?")
    assert isinstance(first, AgentChatResponse) and first.metadata["answer"].sources
    follow = engine.chat("what about its relation to Mamba2?")
    history = [
        {"role": "user", "content": "What is Palimpsa?"},
        {"role": "assistant", "content": first.metadata["answer"].answer},
    ]
    direct = rag.chat("what about its relation to Mamba2?", history)
    answer = follow.metadata["answer"]
    assert [s.paper_id for s in answer.sources] == [s.paper_id for s in direct.sources]
    assert answer.sources[0].paper_id == PALIMPSA_ID
    assert [n.node.metadata["paper_id"] for n in follow.source_nodes] == [
        s.paper_id for s in answer.sources
    ]
    assert [m.role.value for m in engine.chat_history] == ["user", "assistant"] * 2
    engine.reset()
    assert engine.chat_history == []


def test_chat_engine_streams_and_awaits(rag):
    engine = rag.as_chat_engine()
    whole = str(engine.chat(PALIMPSA))
    engine.reset()
    streamed = engine.stream_chat(PALIMPSA)
    pieces = list(streamed.response_gen)
    assert all(pieces[:-1]) and "".join(pieces) == whole
    assert streamed.source_nodes[0].node.metadata["paper_id"] == PALIMPSA_ID
    assert len(engine.chat_history) == 2

    async def run():
        engine.reset()
        said = await engine.achat(PALIMPSA)
        streaming = await engine.astream_chat(PALIMPSA, chat_history=[])
        text = "".join([p async for p in streaming.async_response_gen()])
        return str(said), text, streaming

    said, text, streaming = asyncio.run(run())
    assert said == whole and text.strip() == whole.strip()
    assert streaming.source_nodes and len(engine.chat_history) == 2


# ---- the embedding model -----------------------------------------------------------------------


def test_embed_model_is_the_stores_embedder(rag):
    from llama_index.core.base.embeddings.base import BaseEmbedding

    model = rag.embed_model
    assert isinstance(model, BaseEmbedding) and model.model_name == "test-hash-embedder"
    assert model.get_query_embedding(PALIMPSA) == rag.embedder.embed_query(PALIMPSA)
    assert model.get_text_embedding_batch(["a b", "c"]) == rag.embedder.embed(["a b", "c"])
