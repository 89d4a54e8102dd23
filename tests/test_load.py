"""Load: many chat sessions at once against the running UI, and many threads sharing one `RAG`.

The UI is served by `rag.ui.app.launch(block=False)` on 127.0.0.1 and driven through `gradio_client`
(the chat's submit endpoint `/respond`: message, chat, k, mode; history and per-turn sources are
per-session `gr.State` on the server, so each `Client` is one session). The session driver and its
checks live in `bench/serving/load.py` (`python -m bench.serving.load` prints throughput and
latency).

- extractive: 20 sessions x 2 questions (a question about the session's own seed paper, then a
  follow-up that needs the session's own history on the server), all released at once, on the real
  embedding model (each answer must cite the session's own paper: that takes the real model's
  ranking). A third turn per session would add 20 answers without a new check of session state (the
  topic of a second follow-up is checked in-process by
  test_a_second_follow_up_keeps_the_conversation_topic);
- LLM: 5 sessions x 2 questions on a scripted OpenAI-compatible server (`tests/faultproxy.py`'s
  `ModelStub`, on loopback, answering requests in parallel) and the seed papers indexed with
  `rag.testing.HashEmbedder`: what is asserted is plumbing under concurrency (each session gets its
  own complete LLM answer, streamed by the server), not the model's words or the retrieval's
  ranking. The UI with the real llama.cpp model is tested in tests/test_ui_llm.py.

Threads on one `RAG`: the real model where answers are compared with the single-threaded ones (the
ONNX session and tokenizer shared by 16 threads is part of what is checked);
`rag.testing.HashEmbedder` that sleeps like a model where only the pairing of streams and answers is
checked.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.serving.load import check_all, make_scripts, run_load, summarize
from rag.testing import HashEmbedder
from tests.faultproxy import ModelStub
from tests.servers import free_port

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

QUESTIONS = [
    "How does Palimpsa relate to Mamba2?",
    "Which papers study backdoor attacks on language models?",
    "How can a Bayesian optimization run decide when to stop?",
    "What methods make mixture-of-experts routing more efficient?",
    "Which papers evaluate LLM agents on real software tasks?",
    "What is known about in-context learning in transformers?",
    "What do the indexed papers say about reinforcement learning from human feedback?",
    "How can diffusion models be sampled faster?",
    "What is the capital of France?",  # off-topic: an abstention must be just as stable
    "Which papers study federated learning under heterogeneous clients?",
]


class PacedHashEmbedder(HashEmbedder):
    """`HashEmbedder` (no model) that sleeps `pause` seconds per call, releasing the GIL as the ONNX
    model does while it computes, so threads' requests overlap as they would with the real model,
    without its CPU cost; `max_in_flight` records how many calls overlapped, so a test can show that
    they did."""

    def __init__(self, pause: float = 0.03) -> None:
        super().__init__()
        self.pause, self.in_flight, self.max_in_flight = pause, 0, 0
        self._lock = threading.Lock()

    def _paced(self, work):
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.pause)
            return work()
        finally:
            with self._lock:
                self.in_flight -= 1

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        return self._paced(lambda: super(PacedHashEmbedder, self).embed(texts, truncate))

    def embed_query(self, text: str) -> list[float]:
        return self._paced(lambda: super(PacedHashEmbedder, self).embed_query(text))


def _serve(rag):
    from rag.ui.app import launch

    port = free_port()
    demo = launch(rag, host="127.0.0.1", port=port, block=False)
    return demo, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def extractive_ui(seed_store):
    from rag import RAG

    demo, url = _serve(RAG(store_dir=seed_store, llm="none"))
    yield url
    demo.close()


def _report(results, wall) -> str:
    s = summarize(results, wall)
    return (
        f"{s['answers']} answers in {s['wall_s']:.1f} s ({s['answers_per_s']} answers/s), "
        f"latency p50 {s['latency_p50_s']} s p95 {s['latency_p95_s']} s max {s['latency_max_s']} s"
    )


def test_20_concurrent_sessions_extractive_each_get_their_own_complete_answers(extractive_ui):
    scripts = make_scripts(20, 2)
    results, wall = run_load(extractive_ui, scripts, timeout=180)
    problems = check_all(results, llm=False)
    assert not problems, "\n".join(problems[:30])
    assert sum(len(r.turns) for r in results) == 40
    print(_report(results, wall))


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) spans open at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.fixture(scope="module")
def hash_store(tmp_path_factory):
    """The seed papers indexed with `HashEmbedder`: seconds, no model."""
    from rag import RAG

    store = tmp_path_factory.mktemp("hash_store")
    assert RAG(store_dir=store, embedder=HashEmbedder(), llm="none").ingest().new_papers == 76
    return store


def test_concurrent_sessions_with_the_llm_each_get_their_own_complete_answers(hash_store):
    """5 sessions x 2 questions through an OpenAI-compatible server (`ModelStub`, scripted) on a
    `HashEmbedder` index: plumbing, not the model's words, is asserted; every answer is streamed by
    the server to its end, and the sessions' streams overlap."""
    from rag import RAG

    class MaplessRAG(RAG):
        # The UI offers the paper map only for a RAG that has one (ui/app.py: offers_map).
        # Without this it would lay out this store's map on a background thread (~12 s of CPU: the
        # store has none cached), which this test does not look at and which may still be running
        # when the test process exits.
        paper_map = None

    text = "The indexed papers describe this method and report its results on their benchmarks [1]."
    words = len(text.split(" "))
    with ModelStub(text=text, tokens=words, interval=0.05, model="stub-chat") as stub:
        rag = MaplessRAG(
            store_dir=hash_store,
            embedder=HashEmbedder(),
            openai_base_url=stub.base_url,
            llm_model=stub.model,
            llm_context_tokens=400,
            llm_max_tokens=32,
        )
        assert rag.settings.llm_backend == "openai"
        demo, url = _serve(rag)
        try:
            scripts = make_scripts(5, 2)
            results, wall = run_load(url, scripts, timeout=240)
        finally:
            demo.close()
        streams = list(stub.streams)
    problems = check_all(results, llm=True)
    assert not problems, "\n".join(problems[:30])
    assert sum(len(r.turns) for r in results) == 10
    # These are LLM answers (or the LLM's abstention), not the extractive fallback.
    finals = [r.turns[-1].chat[-1]["text"] for r in results]
    assert not any(f.startswith("Quoted word for word from the abstracts") for f in finals), finals
    # Each answer was streamed to its end by the server, and sessions were served at the same time.
    assert len(streams) == 10 and all(s.tokens_sent == words for s in streams), streams
    assert _most_at_once([(s.started, s.ended) for s in streams]) >= 2, (
        "the sessions' streams never overlapped: they were served one at a time, so this test no"
        " longer shows concurrent sessions kept apart"
    )
    print(_report(results, wall))


def test_threads_sharing_one_rag_get_the_single_threaded_answers(seed_rag):
    """16 threads x 3 asks (each thread its own order, starting at its own question: together they
    ask every question, each about five times at once) equal the answers asked one at a time."""
    expected = {q: seed_rag.ask(q).model_dump() for q in QUESTIONS}
    expected_search = {
        q: [s.model_dump() for s in seed_rag.search(q, k=8, mode="bm25")] for q in QUESTIONS[:3]
    }
    start = threading.Barrier(16)

    def worker(i: int) -> list[tuple[str, dict]]:
        start.wait(timeout=60)
        order = (QUESTIONS[i % len(QUESTIONS) :] + QUESTIONS[: i % len(QUESTIONS)])[:3]
        out = [(q, seed_rag.ask(q).model_dump()) for q in order]
        q = QUESTIONS[i % 3]  # a search in between, on the same object
        assert [s.model_dump() for s in seed_rag.search(q, k=8, mode="bm25")] == expected_search[q]
        return out

    with ThreadPoolExecutor(16) as pool:
        runs = list(pool.map(worker, range(16)))  # re-raises the first exception of any thread
    assert sum(len(r) for r in runs) == 48
    assert {q for run in runs for q, _ in run} == set(QUESTIONS)
    for run in runs:
        for q, got in run:
            assert got == expected[q], q


@pytest.fixture(scope="module")
def paced_rag(hash_store):
    """The `HashEmbedder` index, asked through a `PacedHashEmbedder`."""
    from rag import RAG

    return RAG(store_dir=hash_store, embedder=PacedHashEmbedder(), llm="none")


def test_concurrent_streams_and_chats_on_one_rag_are_not_mixed(paced_rag):
    """Streams interleaved in threads: each thread's final Answer is for its own question. On
    `PacedHashEmbedder`: what is checked is which answer goes with which stream, not the answers'
    content (the real model's answers under threads are compared in the test above); its pauses keep
    12 threads' streams in flight at once, as the real model's computing does, and the test checks
    that they were."""

    def worker(i: int):
        q = QUESTIONS[i % len(QUESTIONS)]
        stream = paced_rag.stream(q)
        text = "".join(stream)
        answer = stream.answer
        history = [{"role": "user", "content": q}, {"role": "assistant", "content": answer.answer}]
        follow = paced_rag.chat("what about its results?", history=history)
        return q, answer, text, follow

    with ThreadPoolExecutor(12) as pool:
        for q, answer, text, follow in pool.map(worker, range(24)):
            assert answer.question == q and text == answer.answer
            assert follow.question == "what about its results?"
    assert paced_rag.embedder.max_in_flight >= 2, (
        "no two threads were ever inside the embedder at once: the streams ran one after another,"
        " so this test no longer shows interleaved streams kept apart"
    )


def test_a_second_follow_up_keeps_the_conversation_topic(seed_rag):
    """Turn 3 of a conversation ("how is it evaluated?" after "what about its results?") is still
    about the paper of turn 1. The extractive rewrite only prepends the *last* user message, itself
    a follow-up, so the topic is lost and the answer abstains (bug: rewrite in
    rag/answer/question.py)."""
    pid, title = "wKMV7mXjUr", "Learning to Remember, Learn, and Forget in Attention-Based Models"
    history: list[dict] = []
    cited_per_turn = []
    for q in (
        f"What does the paper “{title}” propose?",
        "what about its results?",
        "how is it evaluated?",
    ):
        answer = seed_rag.chat(q, history=history)
        cited_per_turn.append([s.paper_id for s in answer.sources if s.cited])
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": answer.answer}]
    assert pid in cited_per_turn[0] and pid in cited_per_turn[1]
    assert pid in cited_per_turn[2], f"turn 3 lost the topic: cited {cited_per_turn[2]}"
