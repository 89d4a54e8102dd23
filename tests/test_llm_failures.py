"""LLM-endpoint failures, injected by a loopback proxy in front of an OpenAI-compatible server.

Contract: every failure of the endpoint becomes an extractive answer (mode "extractive", sources
kept, citations) with `error` set to one line that names the cause and the setting to check, and
never the API key. Transient failures (429, 5xx, timeouts) are retried `llm_retries` times with
backoff, no more.

The faults are protocol, not model quality: behind the proxy is a scripted model on loopback
(tests/faultproxy.ModelStub, which streams a fixed reply in OpenAI's shapes at once) instead of the
tiny real model, whose cold ~500-token prompt cost seconds per test. One path stays on the real
llama.cpp server (SmolLM2-135M): a streamed answer through the proxy, so the proxy is proven against
the real server's stream too. The model's wording is never asserted. Every test asks the same
question over the seeds: the real embedding model answers it behind one memo
(tests/memo_embedder.py), so the extractive fallback's sentences are embedded once, not once per
test.
"""

from __future__ import annotations

import functools
import time

import httpx
import pytest

from rag import RAG, Answer
from tests.conftest import run_cli
from tests.faultproxy import ModelStub, fault_proxy
from tests.memo_embedder import MemoEmbedder

Q = "How does Palimpsa relate to Mamba2?"
SECRET = "sk-test-SECRET-123"
CLI_ENV = {"RAG_LLM_RETRIES": "0", "RAG_LLM_MAX_TOKENS": "64", "RAG_LLM_CONTEXT_TOKENS": "400"}
# The stub's replies, in the shape each answer style asks for: evidence-first (the default) names
# sentences of source 1 on its first line, then writes the synthesis; the free style writes the
# synthesis alone.
EVIDENCE_REPLY = (
    "EVIDENCE: 1.1, 1.2, 1.3\nANSWER: Palimpsa treats Mamba2 as a special case of its attention"
    " [1]."
)
FREE_REPLY = "Palimpsa treats Mamba2 as a special case of its attention-based memory [1]."


def _stub(text: str = EVIDENCE_REPLY, **kw) -> ModelStub:
    """A scripted model that streams `text` once, a word per event, with no delay (plumbing, not a
    model)."""
    return ModelStub(text=text, tokens=len(text.split(" ")), **{"interval": 0.0, **kw})


@pytest.fixture
def stub():
    with _stub() as s:
        yield s


@pytest.fixture
def proxy(stub):
    with fault_proxy(stub.url) as p:
        yield p


@functools.cache
def _embedder() -> MemoEmbedder:
    """The real embedding model behind one memo for the module: the tests share its vectors."""
    from rag.backends.embedders import make_embedder
    from rag.config import Settings

    return MemoEmbedder(make_embedder(Settings(llm="none")))


def _rag(seed_store, proxy_or_url, model, **kw) -> RAG:
    url = proxy_or_url if isinstance(proxy_or_url, str) else proxy_or_url.url + "/v1"
    # A small source budget keeps the real server's (cold) prompt short: one CPU thread reads ~150
    # tokens/s.
    kw = {
        "llm_retries": 0,
        "llm_timeout": 10,
        "llm_max_tokens": 64,
        "llm_context_tokens": 400,
        **kw,
    }
    return RAG(
        store_dir=seed_store, openai_base_url=url, llm_model=model, embedder=_embedder(), **kw
    )


def _assert_fallback(answer: Answer) -> None:
    assert answer.mode == "extractive", answer
    assert answer.error and "\n" not in answer.error
    assert len(answer.sources) == 5
    assert answer.citations and "[1]" in answer.answer


# ----------------------------------------------------------------------------- the library


def test_streaming_passes_through_the_proxy(seed_store, llama_server):
    """The real-server path: the real llama.cpp server's stream, through the proxy, is an LLM
    answer. (The product's default timeout: with 10 s, a cold prompt on a busy 2-core machine timed
    out.)"""
    with fault_proxy(llama_server.url) as proxy:
        stream = _rag(seed_store, proxy, llama_server.model, llm_timeout=60).stream(Q)
        pieces = list(stream)
    answer = stream.answer
    assert isinstance(answer, Answer) and answer.mode == "llm" and answer.error is None, (
        answer.error
    )
    assert len(pieces) > 1 and proxy.count() == 1


def test_streaming_passes_through_the_proxy_from_the_stub(seed_store, stub, proxy):
    """The stub's scripted reply through the proxy is an LLM answer (the path the faults below
    break)."""
    stream = _rag(seed_store, proxy, stub.model).stream(Q)
    pieces = list(stream)
    answer = stream.answer
    assert isinstance(answer, Answer) and answer.mode == "llm" and answer.error is None, (
        answer.error
    )
    assert len(pieces) > 1 and proxy.count() == 1 and len(stub.streams) == 1
    assert "Mamba2" in answer.answer and answer.citations


def test_429_then_ok_is_retried_with_backoff(seed_store, stub, proxy):
    proxy.fail(429, times=2, retry_after="1")
    answer = _rag(seed_store, proxy, stub.model, llm_retries=2).ask(Q)
    assert answer.mode == "llm" and answer.error is None, answer.error
    assert proxy.count() == 3 and len(stub.streams) == 1  # the third try reached the model
    times = [r["time"] for r in proxy.requests if proxy.match in r["path"]]
    assert all(b - a >= 0.25 for a, b in zip(times, times[1:])), times  # backoff between tries
    assert times[-1] - times[0] < 10, times  # and bounded (Retry-After: 1)


def test_429_beyond_retries_falls_back(seed_store, stub, proxy):
    proxy.fail(429, times=None, retry_after="1")
    answer = _rag(seed_store, proxy, stub.model, llm_retries=2).ask(Q)
    _assert_fallback(answer)
    assert "429" in answer.error and "RAG_LLM_RETRIES" in answer.error
    assert proxy.count() == 3 and not stub.streams


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_fall_back_after_bounded_retries(seed_store, stub, proxy, status):
    proxy.fail(status, times=None)
    answer = _rag(seed_store, proxy, stub.model, llm_retries=2).ask(Q)
    _assert_fallback(answer)
    assert "server error" in answer.error and str(status) in answer.error
    assert "OPENAI_BASE_URL" in answer.error
    assert proxy.count() == 3  # retries + 1
    # The retries' backoff is bounded: the tries' span, not the whole call's, which includes the
    # extractive fallback (embedding its sentences took 13 s on a 2-core machine at load 10 and
    # failed a 10 s bound).
    times = [r["time"] for r in proxy.requests if proxy.match in r["path"]]
    assert times[-1] - times[0] < 10, times


def test_timeout_falls_back(seed_store, stub, proxy):
    proxy.delay(3, times=None)
    answer = _rag(seed_store, proxy, stub.model, llm_retries=0, llm_timeout=1).ask(Q)
    _assert_fallback(answer)
    assert "timed out" in answer.error and "RAG_LLM_TIMEOUT" in answer.error
    # One attempt, cut by the timeout (the message says so); no wall-clock bound: a busy 2-core CI
    # once took 4 s around a 1 s timeout.
    assert proxy.count() == 1


@pytest.mark.parametrize("style", ["free", "evidence"])
def test_stream_cut_midway_falls_back(seed_store, style):
    # Four events: the role, then three words (free: the synthesis starts; evidence: still its
    # EVIDENCE line).
    with (
        _stub(FREE_REPLY if style == "free" else EVIDENCE_REPLY) as stub,
        fault_proxy(stub.url) as proxy,
    ):
        proxy.cut_stream(after_events=4, times=None)
        stream = _rag(seed_store, proxy, stub.model, answer_style=style).stream(Q)
        pieces = list(stream)
    answer = stream.answer
    assert proxy.cuts >= 1, "the model's stream ended before the cut"
    assert isinstance(answer, Answer) and all(isinstance(p, str) for p in pieces)
    _assert_fallback(answer)
    assert "broke off" in answer.error and "OPENAI_BASE_URL" in answer.error
    # Nothing of the broken reply was shown: the stream is the fallback answer alone.
    assert "".join(pieces) == answer.answer


def test_unknown_model_names_the_available_one(seed_store, stub):
    """The stub lists its model at /v1/models, as llama.cpp's server does (which answers any name
    asked)."""
    answer = _rag(seed_store, stub.base_url, "no-such-model").ask(Q)
    _assert_fallback(answer)
    assert "no-such-model" in answer.error and "RAG_LLM_MODEL" in answer.error
    assert stub.model in answer.error and not stub.streams


def test_api_key_never_appears_in_errors_or_output(seed_store, stub, proxy):
    # The fault's message repeats the Authorization header, as some real servers do.
    proxy.fail(500, times=None, echo_auth=True)
    answer = _rag(seed_store, proxy, stub.model, openai_api_key=SECRET).ask(Q)
    _assert_fallback(answer)
    assert SECRET not in answer.error and SECRET not in answer.model_dump_json()
    env = {
        **CLI_ENV,
        "OPENAI_BASE_URL": proxy.url + "/v1",
        "OPENAI_API_KEY": SECRET,
        "RAG_LLM_MODEL": stub.model,
    }
    proc = run_cli("ask", Q, "--store", str(seed_store), env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "rag: warning:" in proc.stderr and SECRET not in proc.stdout + proc.stderr
    assert proxy.count() >= 1  # and the key was sent each time:
    sent = [
        {k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in proxy.requests
    ]
    # header names' case varies by client
    assert sent and all(a == f"Bearer {SECRET}" for a in sent)


def test_cli_warns_once_and_prints_the_extractive_answer(seed_store, stub, proxy):
    proxy.fail(503, times=None)
    env = {**CLI_ENV, "OPENAI_BASE_URL": proxy.url + "/v1", "RAG_LLM_MODEL": stub.model}
    proc = run_cli("ask", Q, "--store", str(seed_store), env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("rag: warning:")]
    assert len(warnings) == 1, proc.stderr
    assert "server error" in warnings[0] and "503" in warnings[0]
    assert "References:" in proc.stdout and "[1]" in proc.stdout


# ----------------------------------------------------------------------------- the proxy itself


def test_proxy_passes_through_and_injects_faults():
    """The proxy over the stub streaming 30 words 20 ms apart: events must reach the client as they
    are sent (over 0.05 s apart end to end), not buffered whole."""
    with (
        ModelStub(text="one two three", tokens=30, interval=0.02) as stub,
        fault_proxy(stub.url) as proxy,
    ):
        body = {
            "model": stub.model,
            "max_tokens": 48,
            "stream": True,
            "messages": [{"role": "user", "content": "Count from one to twenty."}],
        }
        with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as c:
            assert c.get("/v1/models").json()["data"][0]["id"] == stub.model
            proxy.fail(503, times=1)
            assert c.post("/v1/chat/completions", json=body).status_code == 503
            with c.stream("POST", "/v1/chat/completions", json=body) as r:  # passes again, streamed
                got = [(time.monotonic(), ln) for ln in r.iter_lines() if ln.startswith("data:")]
            assert len(got) > 3 and got[-1][1] == "data: [DONE]"
            assert got[-1][0] - got[0][0] > 0.05  # events arrived as generated, not buffered whole
            proxy.cut_stream(after_events=2)
            with pytest.raises(httpx.RemoteProtocolError):  # incomplete chunked read
                with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    list(r.iter_lines())
            assert proxy.cuts == 1
            proxy.delay(3)
            with pytest.raises(httpx.ReadTimeout):
                c.post("/v1/chat/completions", json=body, timeout=0.5)
        assert proxy.count() == 4 and proxy.count("/v1/models") == 1
