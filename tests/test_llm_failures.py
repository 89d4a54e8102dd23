"""LLM-endpoint failures, injected by a loopback proxy in front of the real llama server.

Contract: every failure of the endpoint becomes an extractive answer (mode "extractive", sources
kept, citations) with `error` set to one line that names the cause and the setting to check, and
never the API key. Transient failures (429, 5xx, timeouts) are retried `llm_retries` times with
backoff, no more. The tiny model's wording is never asserted.
"""

from __future__ import annotations

import time

import httpx
import pytest

from rag import RAG, Answer
from tests.conftest import run_cli
from tests.faultproxy import fault_proxy

Q = "How does Palimpsa relate to Mamba2?"
SECRET = "sk-test-SECRET-123"
CLI_ENV = {"RAG_LLM_RETRIES": "0", "RAG_LLM_MAX_TOKENS": "64", "RAG_LLM_CONTEXT_TOKENS": "400"}


@pytest.fixture
def proxy(llama_server):
    with fault_proxy(llama_server.url) as p:
        yield p


def _rag(seed_store, proxy_or_url, model, **kw) -> RAG:
    url = proxy_or_url if isinstance(proxy_or_url, str) else proxy_or_url.url + "/v1"
    # A small source budget keeps the (cold) prompt short: one CPU thread reads ~150 tokens/s.
    kw = {"llm_retries": 0, "llm_timeout": 10, "llm_max_tokens": 64, "llm_context_tokens": 400, **kw}
    return RAG(store_dir=seed_store, openai_base_url=url, llm_model=model, **kw)


def _assert_fallback(answer: Answer) -> None:
    assert answer.mode == "extractive", answer
    assert answer.error and "\n" not in answer.error
    assert len(answer.sources) == 5
    assert answer.citations and "[1]" in answer.answer


# ----------------------------------------------------------------------------- the library


def test_streaming_passes_through_the_proxy(seed_store, llama_server, proxy):
    stream = _rag(seed_store, proxy, llama_server.model).stream(Q)
    pieces = list(stream)
    answer = stream.answer
    assert isinstance(answer, Answer) and answer.mode == "llm" and answer.error is None
    assert len(pieces) > 1 and proxy.count() == 1


def test_429_then_ok_is_retried_with_backoff(seed_store, llama_server, proxy):
    proxy.fail(429, times=2, retry_after="1")
    t0 = time.monotonic()
    answer = _rag(seed_store, proxy, llama_server.model, llm_retries=2).ask(Q)
    assert answer.mode == "llm" and answer.error is None, answer.error
    assert proxy.count() == 3
    times = [r["time"] for r in proxy.requests if proxy.match in r["path"]]
    assert all(b - a >= 0.25 for a, b in zip(times, times[1:])), times  # backoff between tries
    assert time.monotonic() - t0 < 10


def test_429_beyond_retries_falls_back(seed_store, llama_server, proxy):
    proxy.fail(429, times=None, retry_after="1")
    answer = _rag(seed_store, proxy, llama_server.model, llm_retries=2).ask(Q)
    _assert_fallback(answer)
    assert "429" in answer.error and "RAG_LLM_RETRIES" in answer.error
    assert proxy.count() == 3


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_fall_back_after_bounded_retries(seed_store, llama_server, proxy, status):
    proxy.fail(status, times=None)
    t0 = time.monotonic()
    answer = _rag(seed_store, proxy, llama_server.model, llm_retries=2).ask(Q)
    _assert_fallback(answer)
    assert "server error" in answer.error and str(status) in answer.error
    assert "OPENAI_BASE_URL" in answer.error
    assert proxy.count() == 3  # retries + 1
    assert time.monotonic() - t0 < 10


def test_timeout_falls_back(seed_store, llama_server, proxy):
    proxy.delay(3, times=None)
    answer = _rag(seed_store, proxy, llama_server.model, llm_retries=0, llm_timeout=1).ask(Q)
    _assert_fallback(answer)
    assert "timed out" in answer.error and "RAG_LLM_TIMEOUT" in answer.error
    # One attempt, cut by the timeout (the message says so); no wall-clock bound: a busy 2-core CI
    # once took 4 s around a 1 s timeout.
    assert proxy.count() == 1


@pytest.mark.parametrize("style", ["free", "evidence"])
def test_stream_cut_midway_falls_back(seed_store, llama_server, proxy, style):
    proxy.cut_stream(after_events=4, times=None)
    stream = _rag(seed_store, proxy, llama_server.model, answer_style=style).stream(Q)
    pieces = list(stream)
    answer = stream.answer
    assert proxy.cuts >= 1, "the model's stream ended before the cut"
    assert isinstance(answer, Answer) and all(isinstance(p, str) for p in pieces)
    _assert_fallback(answer)
    assert "broke off" in answer.error and "OPENAI_BASE_URL" in answer.error
    llm_text = "".join(pieces).replace(answer.answer, "")
    if style == "free":
        assert llm_text.strip(), pieces  # the LLM's partial text was streamed before the fallback
    else:  # four pieces are still the EVIDENCE line, which is read, never shown
        assert "EVIDENCE" not in "".join(pieces)


def test_unknown_model_names_the_available_one(seed_store, llama_server):
    answer = _rag(seed_store, llama_server.base_url, "no-such-model").ask(Q)
    _assert_fallback(answer)
    assert "no-such-model" in answer.error and "RAG_LLM_MODEL" in answer.error
    assert llama_server.model in answer.error


def test_api_key_never_appears_in_errors_or_output(seed_store, llama_server, proxy):
    # The fault's message repeats the Authorization header, as some real servers do.
    proxy.fail(500, times=None, echo_auth=True)
    answer = _rag(seed_store, proxy, llama_server.model, openai_api_key=SECRET).ask(Q)
    _assert_fallback(answer)
    assert SECRET not in answer.error and SECRET not in answer.model_dump_json()
    env = {**CLI_ENV, "OPENAI_BASE_URL": proxy.url + "/v1", "OPENAI_API_KEY": SECRET,
           "RAG_LLM_MODEL": llama_server.model}
    proc = run_cli("ask", Q, "--store", str(seed_store), env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "rag: warning:" in proc.stderr and SECRET not in proc.stdout + proc.stderr
    assert proxy.count() >= 1  # and the key was sent each time:
    sent = [{k.lower(): v for k, v in r["headers"].items()}.get("authorization") for r in proxy.requests]
    assert sent and all(a == f"Bearer {SECRET}" for a in sent)  # header names' case varies by client


def test_cli_warns_once_and_prints_the_extractive_answer(seed_store, llama_server, proxy):
    proxy.fail(503, times=None)
    env = {**CLI_ENV, "OPENAI_BASE_URL": proxy.url + "/v1", "RAG_LLM_MODEL": llama_server.model}
    proc = run_cli("ask", Q, "--store", str(seed_store), env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("rag: warning:")]
    assert len(warnings) == 1, proc.stderr
    assert "server error" in warnings[0] and "503" in warnings[0]
    assert "References:" in proc.stdout and "[1]" in proc.stdout


# ----------------------------------------------------------------------------- the proxy itself
# Last in the file: its own prompt evicts the llama server's prompt cache, which the tests above
# share by asking the same question (a cold ~500-token prompt costs ~3 s on one CPU thread).


def test_proxy_passes_through_and_injects_faults(llama_server, proxy):
    body = {"model": llama_server.model, "max_tokens": 48, "stream": True,
            "messages": [{"role": "user", "content": "Count from one to twenty."}]}
    with httpx.Client(base_url=proxy.url, trust_env=False, timeout=30) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == llama_server.model
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
