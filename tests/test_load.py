"""Load: many chat sessions at once against the running UI, and many threads sharing one `RAG`.

The UI is served by `rag.ui.app.launch(block=False)` on 127.0.0.1 and driven through `gradio_client`
(the chat's submit endpoint `/respond`: message, chat, k, mode; history and per-turn sources are
per-session `gr.State` on the server, so each `Client` is one session). The session driver and its
checks live in `bench/load.py` (`python -m bench.load` prints throughput and latency).

- extractive: 20 sessions x 3 questions (a question about the session's own seed paper, then two
  follow-ups), all released at once;
- LLM (SmolLM2-135M on the llama.cpp test server, one thread): 5 sessions x 2 questions, with
  llm_context_tokens=400 and llm_max_tokens=32 - the server answers one request at a time (about
  2-3 s each, plus a rewrite call per follow-up), so 20 x 3 would take minutes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.load import check_all, make_scripts, run_load, summarize
from tests.servers import free_port

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
    return (f"{s['answers']} answers in {s['wall_s']:.1f} s ({s['answers_per_s']} answers/s), "
            f"latency p50 {s['latency_p50_s']} s p95 {s['latency_p95_s']} s max {s['latency_max_s']} s")


def test_20_concurrent_sessions_extractive_each_get_their_own_complete_answers(extractive_ui):
    scripts = make_scripts(20, 3)
    results, wall = run_load(extractive_ui, scripts, timeout=180)
    problems = check_all(results, llm=False)
    assert not problems, "\n".join(problems[:30])
    assert sum(len(r.turns) for r in results) == 60
    print(_report(results, wall))


def test_concurrent_sessions_with_the_llm_each_get_their_own_complete_answers(seed_store, llama_server):
    from rag import RAG

    rag = RAG(store_dir=seed_store, openai_base_url=llama_server.base_url, llm_model=llama_server.model,
              llm_context_tokens=400, llm_max_tokens=32)
    assert rag.settings.llm_backend == "openai"
    demo, url = _serve(rag)
    try:
        scripts = make_scripts(5, 2)
        results, wall = run_load(url, scripts, timeout=240)
    finally:
        demo.close()
    problems = check_all(results, llm=True)
    assert not problems, "\n".join(problems[:30])
    assert sum(len(r.turns) for r in results) == 10
    # These are LLM answers (or the LLM's abstention), not the extractive fallback.
    finals = [r.turns[-1].chat[-1]["text"] for r in results]
    assert not any(f.startswith("Extracted from the indexed abstracts") for f in finals), finals
    print(_report(results, wall))


def test_threads_sharing_one_rag_get_the_single_threaded_answers(seed_rag):
    """16 threads x 10 asks (each thread its own order) equal the answers asked one at a time."""
    expected = {q: seed_rag.ask(q).model_dump() for q in QUESTIONS}
    expected_search = {q: [s.model_dump() for s in seed_rag.search(q, k=8, mode="bm25")] for q in QUESTIONS[:3]}
    start = threading.Barrier(16)

    def worker(i: int) -> list[tuple[str, dict]]:
        start.wait(timeout=60)
        order = QUESTIONS[i % len(QUESTIONS):] + QUESTIONS[:i % len(QUESTIONS)]
        out = [(q, seed_rag.ask(q).model_dump()) for q in order]
        q = QUESTIONS[i % 3]  # a search in between, on the same object
        assert [s.model_dump() for s in seed_rag.search(q, k=8, mode="bm25")] == expected_search[q]
        return out

    with ThreadPoolExecutor(16) as pool:
        runs = list(pool.map(worker, range(16)))  # re-raises the first exception of any thread
    assert sum(len(r) for r in runs) == 160
    for run in runs:
        for q, got in run:
            assert got == expected[q], q


def test_concurrent_streams_and_chats_on_one_rag_are_not_mixed(seed_rag):
    """Streams interleaved in threads: each thread's final Answer is for its own question."""
    def worker(i: int):
        q = QUESTIONS[i % len(QUESTIONS)]
        stream = seed_rag.stream(q)
        text = "".join(stream)
        answer = stream.answer
        history = [{"role": "user", "content": q}, {"role": "assistant", "content": answer.answer}]
        follow = seed_rag.chat("what about its results?", history=history)
        return q, answer, text, follow

    with ThreadPoolExecutor(12) as pool:
        for q, answer, text, follow in pool.map(worker, range(24)):
            assert answer.question == q and text == answer.answer
            assert follow.question == "what about its results?"


def test_a_second_follow_up_keeps_the_conversation_topic(seed_rag):
    """Turn 3 of a conversation ("how is it evaluated?" after "what about its results?") is still about
    the paper of turn 1. The extractive rewrite only prepends the *last* user message, itself a
    follow-up, so the topic is lost and the answer abstains (bug: rewrite in rag/answer/respond.py)."""
    pid, title = "wKMV7mXjUr", "Learning to Remember, Learn, and Forget in Attention-Based Models"
    history: list[dict] = []
    cited_per_turn = []
    for q in (f"What does the paper “{title}” propose?", "what about its results?", "how is it evaluated?"):
        answer = seed_rag.chat(q, history=history)
        cited_per_turn.append([s.paper_id for s in answer.sources if s.cited])
        history += [{"role": "user", "content": q}, {"role": "assistant", "content": answer.answer}]
    assert pid in cited_per_turn[0] and pid in cited_per_turn[1]
    assert pid in cited_per_turn[2], f"turn 3 lost the topic: cited {cited_per_turn[2]}"
