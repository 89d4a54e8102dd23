"""The real test servers of tests/servers.py work: llama-cpp-python's server and Chroma."""

from __future__ import annotations

import json
import sys
import time

import httpx
import pytest

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

try:
    from tests import servers as _servers
except ImportError:  # tests/ is not a package (yet): it is on sys.path itself
    import servers as _servers

free_port, unique_name = _servers.free_port, _servers.unique_name

# The fixtures normally come from tests/conftest.py (`from tests.servers import *`); register
# them here only when no conftest already did, so the session runs one server of each kind.
if not any(
    hasattr(m, "llama_server")
    for n, m in list(sys.modules.items())
    if n == "conftest" or n.endswith(".conftest")
):
    globals().update({n: getattr(_servers, n) for n in _servers.__all__})


def _http() -> httpx.Client:
    return httpx.Client(timeout=120, trust_env=False)


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_llama_server_lists_its_model(llama_server):
    assert llama_server.base_url == f"http://127.0.0.1:{llama_server.port}/v1"
    with _http() as c:
        data = c.get(f"{llama_server.base_url}/models").json()["data"]
    assert [m["id"] for m in data] == [llama_server.model]
    assert llama_server.proc.poll() is None


def test_llama_server_streams_chat(llama_server):
    body = {
        "model": llama_server.model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    pieces, finish, t0, ttft = [], None, time.perf_counter(), None
    with (
        _http() as c,
        c.stream("POST", f"{llama_server.base_url}/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            assert chunk["object"] == "chat.completion.chunk"
            choice = chunk["choices"][0]
            if choice["delta"].get("content"):
                ttft = ttft or time.perf_counter() - t0
                pieces.append(choice["delta"]["content"])
            finish = choice.get("finish_reason") or finish
    assert len(pieces) >= 2, pieces  # really streamed, not one blob
    assert "".join(pieces).strip()
    assert finish in ("stop", "length")


def test_llama_server_reports_usage_with_openai_client(llama_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(
        base_url=llama_server.base_url, api_key="unused", max_retries=0, http_client=_http()
    )
    # Streaming chunks carry no usage on llama-cpp-python's server: usage comes with
    # non-streaming responses.
    resp = client.chat.completions.create(
        model=llama_server.model,
        max_tokens=8,
        temperature=0,
        messages=[{"role": "user", "content": "Name one colour."}],
    )
    assert resp.choices[0].message.content is not None
    u = resp.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 8
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    stream = client.chat.completions.create(
        model=llama_server.model,
        max_tokens=8,
        temperature=0,
        stream=True,
        messages=[{"role": "user", "content": "Name one colour."}],
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text.strip()


def test_llama_server_answers_any_model_name(llama_server):
    # A trap the library must handle: unknown model names are not rejected.
    with _http() as c:
        r = c.post(
            f"{llama_server.base_url}/chat/completions",
            json={
                "model": "no-such-model",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    assert r.status_code == 200


def test_llama_server_with_api_key_rejects_missing_key(llama_server_factory):
    srv = llama_server_factory(api_key="SECRET")
    assert srv.api_key == "SECRET"
    body = {"model": srv.model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    with _http() as c:
        assert c.get(f"{srv.base_url}/models").status_code == 401
        assert c.post(f"{srv.base_url}/chat/completions", json=body).status_code == 401
        bad = {"Authorization": "Bearer WRONG"}
        assert c.post(f"{srv.base_url}/chat/completions", json=body, headers=bad).status_code == 401
        ok = c.post(f"{srv.base_url}/chat/completions", json=body, headers=srv.headers)
        assert ok.status_code == 200
    assert llama_server_factory(api_key="SECRET") is srv  # shared for equal arguments


def test_chroma_server_roundtrip(chroma_server):
    import chromadb
    from chromadb.config import Settings

    assert chroma_server == f"http://127.0.0.1:{chroma_server.port}" == chroma_server.url
    client = chromadb.HttpClient(
        host=chroma_server.host,
        port=chroma_server.port,
        settings=Settings(anonymized_telemetry=False),
    )
    assert client.heartbeat() > 0
    col = client.create_collection(
        unique_name("papers"), embedding_function=None, metadata={"hnsw:space": "cosine"}
    )
    col.upsert(
        ids=["a", "b", "c"],
        embeddings=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.7, 0.7, 0.0]],
        documents=["alpha", "beta", "gamma"],
        metadatas=[{"paper_id": "a"}, {"paper_id": "b"}, {"paper_id": "c"}],
    )
    col.upsert(
        ids=["a"], embeddings=[[0.9, 0.1, 0.0]], documents=["alpha2"], metadatas=[{"paper_id": "a"}]
    )
    assert col.count() == 3
    res = col.query(
        query_embeddings=[[1.0, 0.0, 0.0]],
        n_results=2,
        include=["documents", "distances", "metadatas"],
    )
    assert res["ids"][0] == ["a", "c"]
    assert res["documents"][0][0] == "alpha2"
    assert res["distances"][0][0] < res["distances"][0][1]
    client.delete_collection(col.name)


def test_chroma_server_factory_can_stop(chroma_server_factory):
    srv = chroma_server_factory()
    with _http() as c:
        assert c.get(f"{srv.url}/api/v2/heartbeat").status_code == 200
        srv.stop()
        assert srv.proc.poll() is not None
        with pytest.raises(httpx.TransportError):
            c.get(f"{srv.url}/api/v2/heartbeat", timeout=2)


def test_llama_server_finishes_concurrent_streams(llama_server):
    # --interrupt_requests False: a second request queues instead of cutting the first short.
    from concurrent.futures import ThreadPoolExecutor

    def stream(i: int) -> tuple[str, str | None]:
        body = {
            "model": llama_server.model,
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
            "messages": [{"role": "user", "content": f"Count from {i} upwards."}],
        }
        text, finish = "", None
        with (
            _http() as c,
            c.stream("POST", f"{llama_server.base_url}/chat/completions", json=body) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[len("data: ") :])["choices"][0]
                    text += choice["delta"].get("content") or ""
                    finish = choice.get("finish_reason") or finish
        return text, finish

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(stream, [1, 2, 3]))
    assert all(text.strip() and finish in ("stop", "length") for text, finish in results), results
