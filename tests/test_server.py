"""`rag serve`, the OpenAI-compatible HTTP API, as other apps use it.

Real parts only: `rag serve` runs as a subprocess on a free loopback port over the seed store, and
the tests talk to it with the official `openai` client (as an app would) and httpx for the raw HTTP
cases. Answers are extractive (no LLM) except in the LLM test, which puts the real llama.cpp server
(SmolLM2) behind it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from rag.answer.citations import MARKER, parse_markers, split_sentences
from rag.markers import plain_text
from tests.conftest import REPO, run_cli
from tests.harness import free_port, log_tail, popen_logged, stop_process, wait_http_ready

KEY = "test-key-7f3a9c"
QUESTION = "How does Palimpsa relate to Mamba2?"
START_TIMEOUT = 120.0


class ApiServer:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"

    def client(self, key: str | None = KEY, **kw) -> openai.OpenAI:
        # max_retries=0: a retried request would hide an error the server made.
        return openai.OpenAI(
            base_url=self.base_url, api_key=key or "none", max_retries=0, timeout=120, **kw
        )

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
            trust_env=False,
        )


def start_api(store: Path, tmp: Path, env: dict[str, str] | None = None, *args: str) -> ApiServer:
    port = free_port()
    log = tmp / f"rag-serve-{port}.log"
    full_env = {**os.environ, "RAG_API_KEY": KEY, **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "rag.cli",
        "serve",
        "--store",
        str(store),
        "--port",
        str(port),
        *args,
    ]
    proc = popen_logged(cmd, log, full_env, REPO)
    wait_http_ready(proc, f"http://127.0.0.1:{port}/healthz", log, START_TIMEOUT)
    return ApiServer(proc, port, log)


@pytest.fixture(scope="module")
def api(seed_store, tmp_path_factory) -> Iterator[ApiServer]:
    """`rag serve` over the seed store with RAG_API_KEY set; extractive answers."""
    server = start_api(seed_store, tmp_path_factory.mktemp("api"))
    try:
        yield server
    finally:
        stop_process(server.proc)
    assert "Traceback" not in log_tail(server.log, 400), log_tail(server.log)


def _rag(obj) -> dict:
    """The `rag` extension of a completion or chunk (an extra field for the openai client)."""
    extra = obj.model_extra or {}
    assert "rag" in extra, f"no `rag` field in {obj}"
    # the `rag ask --json` object
    assert extra["rag"].keys() >= {"question", "answer", "citations", "sources"}
    return extra["rag"]


def _check_markers(content: str, answer: dict) -> None:
    """The [n] markers of the text are the cited sources, each with its References line."""
    body, _, refs = content.partition("\n\nReferences:\n")
    markers = set(parse_markers(body))
    cited = {s["n"] for s in answer["sources"] if s["cited"]}
    assert markers, content
    assert markers == cited == {c["n"] for c in answer["citations"]}
    for s in answer["sources"]:
        line = f"[{s['n']}] {s['title']}" + (f" — {s['url']}" if s["url"] else "")
        assert (line in refs.splitlines()) == s["cited"], (line, refs)
    assert set(parse_markers(answer["answer"])) == cited


# ---- answers ------------------------------------------------------------------------------------


def test_started_with_one_line_naming_its_url(api):
    lines = api.log.read_text().splitlines()  # stdout and stderr
    assert (
        lines.count(f"rag serve: OpenAI-compatible API on {api.base_url} (Ctrl+C stops it)") == 1
    ), lines
    assert len(lines) == 1, lines  # nothing else: no banner, no access log, no warnings


def test_non_streamed_answer_carries_markers_and_sources(api):
    completion = api.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": QUESTION}]
    )
    # echoed back
    assert completion.object == "chat.completion" and completion.model == "gpt-4o-mini"
    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    answer = _rag(completion)
    assert (
        answer["question"] == QUESTION
        and answer["mode"] == "extractive"
        and not answer["abstained"]
    )
    assert set(answer) == {
        "question",
        "answer",
        "mode",
        "outcome",
        "abstained",
        "grounding",
        "citations",
        "sources",
        "usage",
        "error",
    }  # the contract's `rag ask --json` shape
    assert answer["sources"][0]["paper_id"] == "wKMV7mXjUr"  # the Palimpsa paper, cited first
    assert answer["sources"][0]["cited"] and 0 <= answer["sources"][0]["score"] <= 1
    _check_markers(choice.message.content, answer)
    usage = completion.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 50
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_answer_ends_with_the_sources(api):
    client = api.client()
    chunks = list(
        client.chat.completions.create(
            model="rag", stream=True, messages=[{"role": "user", "content": QUESTION}]
        )
    )
    assert (
        all(c.object == "chat.completion.chunk" for c in chunks)
        and len({c.id for c in chunks}) == 1
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks].count("stop") == 1
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop" and last.usage.completion_tokens > 50
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    answer = _rag(last)
    _check_markers(content, answer)
    # Streamed or not, the same text (extractive answers are deterministic).
    plain = client.chat.completions.create(
        model="rag", messages=[{"role": "user", "content": QUESTION}]
    )
    assert content == plain.choices[0].message.content
    assert answer == _rag(plain)


def test_raw_sse_format(api):
    """The wire format itself: `data: {...}` events, then `data: [DONE]`."""
    with (
        api.http() as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "rag",
                "stream": True,
                "k": 3,
                "mode": "dense",
                "messages": [{"role": "user", "content": QUESTION}],
            },
        ) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    final = json.loads(events[-2][6:])
    assert final["choices"][0]["finish_reason"] == "stop" and len(final["rag"]["sources"]) == 3


def test_history_and_extension_fields(api):
    """Earlier turns are the history: a follow-up is answered about the topic before it; k and mode
    apply."""
    first = api.client().chat.completions.create(
        model="rag", messages=[{"role": "user", "content": QUESTION}]
    )
    follow = api.client().chat.completions.create(
        model="rag",
        extra_body={"k": 2, "mode": "hybrid"},
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": [{"type": "text", "text": "what about its results?"}]},
        ],
    )
    answer = _rag(follow)
    assert answer["question"] == "what about its results?"
    assert len(answer["sources"]) == 2 and answer["sources"][0]["paper_id"] == "wKMV7mXjUr"


# ---- other routes
# ---------------------------------------------------------------------------------


def test_search_is_rag_search_json(api, seed_store):
    with api.http() as http:
        r = http.post("/v1/search", json={"query": "state space models", "k": 3})
    assert r.status_code == 200
    proc = run_cli("search", "state space models", "--k", "3", "--json", "--store", str(seed_store))
    assert proc.returncode == 0, proc.stderr
    # The same object, with the note that its passages are untrusted document text (issue 31).
    assert "untrusted document text" in r.json()["untrusted"]
    assert {k: v for k, v in r.json().items() if k not in ("untrusted", "sentences")} == json.loads(
        proc.stdout
    )
    # ... and each result's passage, sentence by sentence, with its flag (issue 50)
    assert [" ".join(s["text"] for s in x) for x in r.json()["sentences"]] == [
        " ".join(split_sentences(x["passage"])) for x in r.json()["results"]
    ]
    # In retrieval order, with the contract's keys: `n` is the rank (../shared/CONTRACT.md).
    results = r.json()["results"]
    assert [x["n"] for x in results] == [1, 2, 3]
    assert all(
        set(x) == {"n", "paper_id", "title", "authors", "url", "score", "passage", "cited"}
        for x in results
    )


def test_models_paper_and_health(api):
    client = api.client()
    assert [m.id for m in client.models.list()] == ["rag"]
    assert client.models.retrieve("rag").id == "rag"
    with api.http() as http:
        paper = http.get("/v1/papers/wKMV7mXjUr").json()
        assert paper["title"] == "Learning to Remember, Learn, and Forget in Attention-Based Models"
        assert (
            paper["url"] == "https://openreview.net/forum?id=wKMV7mXjUr"
            and len(paper["authors"]) == 5
        )
        assert set(paper) == {"paper_id", "title", "authors", "venue", "year", "url"}
        assert (paper["venue"], paper["year"]) == ("ICML 2026", "2026")  # as `rag cite` gives them
    # /healthz needs no key (a load balancer's probe).
    with httpx.Client(trust_env=False) as bare:
        assert bare.get(f"{api.url}/healthz").json() == {"status": "ok", "papers": 76}


# ---- keys and errors
# ------------------------------------------------------------------------------


def _assert_error(r: httpx.Response, status: int, *words: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, (
        body
    )
    message = body["error"]["message"]
    assert "\n" not in message and "Traceback" not in message and message
    for word in words:
        assert word.lower() in message.lower(), message
    return body["error"]


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_key_required(api, key):
    with pytest.raises(openai.AuthenticationError) as err:
        api.client(key).chat.completions.create(
            model="rag", messages=[{"role": "user", "content": QUESTION}]
        )
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=api.url, headers=headers, trust_env=False) as http:
        for method, path in (
            ("GET", "/v1/models"),
            ("POST", "/v1/search"),
            ("GET", "/v1/papers/wKMV7mXjUr"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/nothing"),
        ):
            r = http.request(method, path, json={"query": "x"})
            _assert_error(r, 401, "API key")
            assert r.headers["www-authenticate"] == "Bearer"


def test_mcp_mount_needs_the_key_too(api):
    pytest.importorskip("rag.serve.mcp")
    from rag.serve import mcp as mcp_server

    if not hasattr(mcp_server, "make_mcp_http_app"):
        pytest.skip("rag.serve.mcp has no HTTP app yet")
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    with httpx.Client(trust_env=False) as bare:
        _assert_error(bare.post(f"{api.url}/mcp", json=call, headers=accept), 401, "API key")
    with api.http() as http:
        r = http.post("/mcp", json=call, headers=accept)
    assert r.status_code == 200, r.text
    assert {t["name"] for t in r.json()["result"]["tools"]} >= {"search_papers", "ask", "get_paper"}


def _chat(question, **extra) -> dict:
    return {"model": "rag", "messages": [{"role": "user", "content": question}], **extra}


ERRORS = [
    # (id, method, path, body (dict: JSON; bytes: raw), status, words in the message, param)
    (
        "no-messages",
        "POST",
        "/v1/chat/completions",
        {"model": "rag", "messages": []},
        400,
        ["no user message"],
        "messages",
    ),
    (
        "missing-messages",
        "POST",
        "/v1/chat/completions",
        {"model": "rag"},
        400,
        ["missing", "messages"],
        "messages",
    ),
    (
        "only-system",
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "system", "content": "hi"}]},
        400,
        ["no user message"],
        "messages",
    ),
    (
        "empty-question",
        "POST",
        "/v1/chat/completions",
        _chat("   "),
        400,
        ["question is empty"],
        "messages",
    ),
    (
        "k=0",
        "POST",
        "/v1/chat/completions",
        _chat(QUESTION, k=0),
        400,
        ["k must be between 1 and 100"],
        "k",
    ),
    ("k=1000", "POST", "/v1/search", {"query": "x", "k": 1000}, 400, ["k must be between"], "k"),
    (
        "bad-mode",
        "POST",
        "/v1/chat/completions",
        _chat(QUESTION, mode="fuzzy"),
        400,
        ["unknown retrieval mode"],
        "mode",
    ),
    (
        "k-string",
        "POST",
        "/v1/chat/completions",
        _chat(QUESTION, k="five"),
        422,
        ["valid integer"],
        "k",
    ),
    (
        "stream-string",
        "POST",
        "/v1/chat/completions",
        _chat(QUESTION, stream="yes"),
        422,
        ["boolean"],
        "stream",
    ),
    (
        "content-number",
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": 5}]},
        422,
        ["string or a list"],
        "messages.0.content",
    ),
    (
        "image-part",
        "POST",
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        400,
        ["only text"],
        "messages.0.content",
    ),
    (
        "bad-role",
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "wizard", "content": "x"}]},
        400,
        ["role"],
        "messages.0.role",
    ),
    ("query-list", "POST", "/v1/search", {"query": ["a"]}, 422, ["valid string"], "query"),
    (
        "long-question",
        "POST",
        "/v1/chat/completions",
        _chat("why " * 600),
        400,
        ["keep it under 2000"],
        "messages",
    ),
    (
        "malformed-json",
        "POST",
        "/v1/chat/completions",
        b'{"messages": [',
        400,
        ["not valid JSON"],
        None,
    ),
    ("not-an-object", "POST", "/v1/search", b'["query"]', 400, ["JSON object"], None),
    ("empty-body", "POST", "/v1/search", b"", 400, ["empty"], None),
    ("deep-nesting", "POST", "/v1/search", b"[" * 60000, 400, ["not valid JSON"], None),
    ("oversized", "POST", "/v1/chat/completions", _chat("x" * 70_000), 413, ["64 kB"], None),
    ("unknown-paper", "GET", "/v1/papers/NOPE123456", None, 404, ["unknown paper id"], "paper_id"),
    ("unknown-model", "GET", "/v1/models/gpt-5", None, 404, ["does not exist"], "model"),
    ("unknown-route", "GET", "/v2/whatever", None, 404, ["no route"], None),
    ("wrong-method", "GET", "/v1/chat/completions", None, 405, ["not allowed"], None),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_errors_use_the_openai_shape(api, case):
    _, method, path, body, status, words, param = case
    kwargs = (
        {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    )
    with api.http() as http:
        r = http.request(method, path, **kwargs)
    error = _assert_error(r, status, *words)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_oversized_chunked_body_is_refused_as_it_arrives(api):
    """No Content-Length (chunked): refused once 64 kB have arrived, not after reading it all."""
    sent = []

    def body():
        for _ in range(1000):  # 8 MB if it were all read
            sent.append(1)
            yield b"x" * 8192

    with api.http() as http:
        r = http.post("/v1/chat/completions", content=body())
    _assert_error(r, 413, "64 kB")


def test_openai_client_raises_its_own_errors(api):
    """An app sees the OpenAI client's exception classes, with the server's message."""
    client = api.client()
    with pytest.raises(openai.BadRequestError, match="question is empty"):
        client.chat.completions.create(model="rag", messages=[{"role": "user", "content": ""}])
    with pytest.raises(openai.BadRequestError, match="k must be between"):
        client.chat.completions.create(
            model="rag",
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            extra_body={"k": 0},
        )
    with pytest.raises(openai.NotFoundError, match="unknown paper id"):
        client.get("/papers/NOPE123456", cast_to=object)


def test_refuses_a_public_address_without_a_key(seed_store):
    proc = run_cli(
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        str(free_port()),
        "--store",
        str(seed_store),
        timeout=60,
    )
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "RAG_API_KEY" in lines[0] and "--allow-no-key" in lines[0], (
        proc.stderr
    )
    assert proc.stdout == ""


def test_key_setting_stays_out_of_reprs(monkeypatch):
    from rag.config import Settings

    monkeypatch.setenv("RAG_API_KEY", "sk-never-shown")
    monkeypatch.setenv("RAG_API_PORT", "8123")
    settings = Settings()
    assert settings.api_key == "sk-never-shown" and settings.api_port == 8123
    assert "sk-never-shown" not in repr(settings) and "sk-never-shown" not in str(settings)
    monkeypatch.setenv("RAG_API_KEY", "  ")
    # a blank key is no key (not a key that "Bearer " would match)
    assert Settings().api_key is None


def test_escaped_brackets_split_across_pieces_are_undone():
    from rag.serve.openai_shapes import Unescaper

    u = Unescaper()
    out = u.feed("W\\") + u.feed("[1\\") + u.feed("]-hard \\\\") + u.feed("[2]") + u.close()
    assert out == "W[1]-hard \\[2]"


def test_missing_store_is_one_line(tmp_path):
    proc = run_cli(
        "serve", "--port", str(free_port()), "--store", str(tmp_path / "nope"), timeout=60
    )
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "there is no index" in proc.stderr


# ---- an app built on it
# ---------------------------------------------------------------------------

AGENT = r'''
"""An app that uses `rag serve` as a tool source with nothing but the openai client and its usual
environment variables (OPENAI_BASE_URL, OPENAI_API_KEY)."""
import json
from openai import OpenAI

client = OpenAI(max_retries=0)
model = client.models.list().data[0].id

def ask(question, history=()):
    completion = client.chat.completions.create(
        model=model, messages=[*history, {"role": "user", "content": question}])
    answer = completion.model_extra["rag"]   # sources and citations beside the text
    return completion.choices[0].message.content, answer

text, answer = ask("How does Palimpsa relate to Mamba2?")
papers = [client.get(f"/papers/{s['paper_id']}", cast_to=object)
          for s in answer["sources"] if s["cited"]]
hits = client.post("/search", body={"query": papers[0]["title"], "k": 3}, cast_to=object)["results"]
follow_text, follow = ask("what about its results?", [
    {"role": "user", "content": "How does Palimpsa relate to Mamba2?"},
    {"role": "assistant", "content": text}])
print(json.dumps({"model": model, "text": text, "cited": [p["paper_id"] for p in papers],
                  "titles": [p["title"] for p in papers], "search_top": hits[0]["paper_id"],
                  "follow_question": follow["question"],
                  "follow_top": follow["sources"][0]["paper_id"]}))
'''


def test_an_app_uses_it_as_a_tool_source(api, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {**os.environ, "OPENAI_BASE_URL": api.base_url, "OPENAI_API_KEY": KEY}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (
        out["model"] == "rag"
        and out["cited"] == ["wKMV7mXjUr"]
        and out["search_top"] == "wKMV7mXjUr"
    )
    assert "[1]" in out["text"] and out["titles"][0] in out["text"]  # the References line names it
    assert out["follow_question"] == "what about its results?" and out["follow_top"] == "wKMV7mXjUr"


# ---- load
# ------------------------------------------------------------------------------------------

LOAD_QUESTIONS = [
    "How does Palimpsa relate to Mamba2?",
    "Which paper studies machine unlearning?",
    "What is proposed for efficient LLM alignment?",
    "Which methods improve long-context memory in attention?",
    "How are diffusion models used in these papers?",
]
LOAD_CLIENTS = 20
LOAD_SECONDS = 20.0


@pytest.mark.slow
def test_concurrent_clients_get_their_own_answers(api):
    """20 concurrent clients (threads, half streaming) for ~20 s: no errors, and every answer echoes
    the question its own client sent (each question is unique, so a crossed answer would show). 20
    s, not a minute: the CI machines here have 2 busy cores, and a minute of this would dominate the
    suite."""
    errors: list[str] = []
    done: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + LOAD_SECONDS

    def client_loop(i: int) -> None:
        client = api.client()
        j = 0
        while time.monotonic() < deadline:
            question = f"{LOAD_QUESTIONS[(i + j) % len(LOAD_QUESTIONS)]} (client {i}, request {j})"
            t0 = time.perf_counter()
            try:
                messages = [{"role": "user", "content": question}]
                if i % 2:
                    chunks = list(
                        client.chat.completions.create(
                            model=f"c{i}", messages=messages, stream=True
                        )
                    )
                    answer, model = _rag(chunks[-1]), chunks[-1].model
                else:
                    completion = client.chat.completions.create(model=f"c{i}", messages=messages)
                    answer, model = _rag(completion), completion.model
                if answer["question"] != question or model != f"c{i}":
                    raise AssertionError(
                        f"client {i} sent {question!r}, got {answer['question']!r} ({model})"
                    )
            except Exception as exc:
                with lock:
                    errors.append(f"client {i} request {j}: {type(exc).__name__}: {exc}")
            else:
                with lock:
                    done.append(time.perf_counter() - t0)
            j += 1

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(LOAD_CLIENTS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=LOAD_SECONDS + 180)
    elapsed = time.monotonic() - start
    assert not errors, errors[:5]
    assert len(done) >= LOAD_CLIENTS, len(done)  # every client got answers
    done.sort()
    print(
        f"\nload: {len(done)} answers in {elapsed:.1f} s ({len(done) / elapsed:.1f}/s) by"
        f" {LOAD_CLIENTS} clients; p50 {done[len(done) // 2]:.2f} s, p95"
        f" {done[int(len(done) * 0.95)]:.2f} s"
    )
    with httpx.Client(trust_env=False) as bare:  # and it still serves
        assert bare.get(f"{api.url}/healthz").json()["status"] == "ok"


# ---- with an LLM
# ----------------------------------------------------------------------------------


def test_llm_answer_streams_through_the_api(seed_store, llama_server, tmp_path):
    env = {
        "OPENAI_BASE_URL": llama_server.base_url,
        "RAG_LLM_MODEL": llama_server.model,
        "RAG_LLM_MAX_TOKENS": "96",
    }
    server = start_api(seed_store, tmp_path, env)
    try:
        client = server.client()
        stream = client.chat.completions.create(
            model="rag",
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": QUESTION}],
        )
        chunks = list(stream)
        pieces = [
            c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
        ]
        last = chunks[-1]
        answer = _rag(last)
        # The stream is the checked answer (then its references): nothing shown is taken back.
        streamed = "".join(pieces).partition("\n\nReferences:")[0]
        assert streamed.strip() == plain_text(answer["answer"]).strip()
        assert answer["mode"] == "llm" and answer["error"] is None
        assert last.usage.prompt_tokens > 100 and last.usage.completion_tokens > 0
        # the LLM's, not a recount
        assert last.usage.prompt_tokens == answer["usage"]["prompt_tokens"]
        cited = {s["n"] for s in answer["sources"] if s["cited"]}
        assert {
            int(n)
            for m in MARKER.finditer(answer["answer"])
            for n in re.findall(r"\d+", m.group(1))
        } == cited
        content = "".join(pieces)
        assert all(f"[{n}] " in content.rpartition("References:\n")[2] for n in cited)
        # The same server, not streamed: usage from the LLM too.
        completion = client.chat.completions.create(
            model="rag", messages=[{"role": "user", "content": QUESTION}]
        )
        assert _rag(completion)["mode"] == "llm" and completion.usage.completion_tokens > 0
    finally:
        stop_process(server.proc)
    assert "Traceback" not in server.log.read_text(errors="replace"), log_tail(server.log)


# ---- bounded request heads, websockets, GET /mcp (hardening)
# --------------------------------------


def _raw(api: ApiServer, request: bytes, timeout: float = 20.0) -> bytes:
    """Send `request` on a fresh connection and read until the server closes it (or `timeout`)."""
    import socket

    with socket.create_connection(("127.0.0.1", api.port), timeout=timeout) as sock:
        try:
            sock.sendall(request)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while sending: what it answered (if anything) is still read below
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    return data


def _status(response: bytes) -> int | None:
    line = response.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else None


@pytest.mark.parametrize(
    "case",
    [
        (
            "long-url",
            b"GET /healthz?" + b"q" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "request line",
        ),
        (
            "many-headers",
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"".join(b"X-H%d: v\r\n" % i for i in range(150))
            + b"\r\n",
            "100 headers",
        ),
        (
            "large-head",
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1500) for i in range(60))
            + b"\r\n",
            "64 kB",
        ),
    ],
    ids=lambda c: c[0],
)
def test_an_oversized_request_head_is_431_before_the_key_check(api, case):
    """The head is bounded before any route or key check: 431 in the OpenAI error shape, connection
    closed."""
    _, request, words = case
    response = _raw(api, request)
    assert _status(response) == 431, response[:300]
    body = json.loads(response.partition(b"\r\n\r\n")[2])
    assert (
        body["error"]["code"].startswith(("request_", "too_many"))
        and words in body["error"]["message"]
    )


def test_a_32_mb_header_on_healthz_is_not_answered_200(api):
    """As the attacker sent it: refused (431, or the connection closed) once 64 kB have arrived."""
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "

    def chunks():
        yield head
        for _ in range(32 * 16):  # 32 MB in 64 kB pieces
            yield b"a" * 65536

    import socket

    sent = 0
    with socket.create_connection(("127.0.0.1", api.port), timeout=20) as sock:
        try:
            for chunk in chunks():
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            response = sock.recv(65536)
        except ConnectionResetError:
            response = b""
    assert _status(response) in (431, None), response[:300]  # never 200
    assert sent < 32 * 1024 * 1024, "the server read a 32 MB header to the end"
    with httpx.Client(trust_env=False) as bare:  # and it still serves
        assert bare.get(f"{api.url}/healthz").json()["status"] == "ok"


def test_a_websocket_to_mcp_is_refused_without_a_traceback(api):
    handshake = (
        b"GET /mcp/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    )
    for _ in range(3):
        assert _status(_raw(api, handshake, timeout=10)) == 403
    time.sleep(0.2)
    assert "Traceback" not in api.log.read_text(errors="replace"), log_tail(api.log)


def test_get_mcp_with_the_key_is_405_not_an_endless_stream(api):
    """Stateless JSON endpoint: no server-to-client stream to open; the MCP spec's answer is 405."""
    with api.http() as http:
        r = http.get("/mcp", headers={"Accept": "text/event-stream"}, timeout=10)
        assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
        assert "POST" in r.json()["error"]["message"]
        assert http.delete("/mcp", timeout=10).status_code == 405


# ---- a client that leaves stops the model (cancellation)
# -------------------------------------------

# seconds; the target is 1 s (bench/serving/cancel_latency.py prints the figures), slack for a busy
# CI
CANCEL_BOUND = 3.0


@pytest.fixture
def stub_api(seed_store, tmp_path):
    """`rag serve` whose LLM is a scripted slow model on loopback (tests/faultproxy.ModelStub: 400
    words, one per 50 ms, so 20 s for a whole answer) that records when its client closed the
    connection."""
    from tests.faultproxy import ModelStub

    with ModelStub() as stub:
        env = {
            "OPENAI_BASE_URL": stub.base_url,
            "RAG_LLM_MODEL": stub.model,
            "RAG_LLM_CHECK": "false",
        }
        server = start_api(seed_store, tmp_path, env)
        try:
            yield server, stub
        finally:
            stop_process(server.proc)
    assert "Traceback" not in server.log.read_text(errors="replace"), log_tail(server.log)


def _wait_closed(stub, left: float) -> float:
    """Seconds from `left` (the client's hang-up) until the model connection closed (inf: not in 15
    s)."""
    record = stub.streams[0]
    deadline = time.monotonic() + 15
    while record.client_closed is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return (record.client_closed - left) if record.client_closed is not None else float("inf")


def test_a_dropped_stream_closes_the_model_connection(stub_api):
    server, stub = stub_api
    body = _chat(QUESTION, stream=True)
    with httpx.Client(
        trust_env=False, timeout=60, headers={"Authorization": f"Bearer {KEY}"}
    ) as http:
        with http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            stub.wait_stream()  # the model is generating
            time.sleep(0.3)
        left = time.monotonic()  # the response closed: httpx drops the connection
    took = _wait_closed(stub, left)
    record = stub.streams[0]
    print(
        f"\nmodel connection closed {took:.2f} s after the client left ({record.tokens_sent} of 400"
        " words sent)"
    )
    assert took < CANCEL_BOUND, (
        f"the model connection stayed open {took:.1f} s after the client left"
    )
    assert record.tokens_sent < 200


def _post_and_leave(server: ApiServer, stub, path: str, payload: dict) -> float:
    """POST `payload` on a raw connection, close it once the model is generating, and return
    when."""
    import socket

    body = json.dumps(payload).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        stub.wait_stream()
        time.sleep(0.3)
    return time.monotonic()


def test_a_dropped_plain_request_closes_the_model_connection(stub_api):
    """Not streamed: a client that gives up (its timeout) also stops the model."""
    server, stub = stub_api
    took = _wait_closed(
        stub, _post_and_leave(server, stub, "/v1/chat/completions", _chat(QUESTION))
    )
    print(f"\nmodel connection closed {took:.2f} s after the client left")
    assert took < CANCEL_BOUND, (
        f"the model connection stayed open {took:.1f} s after the client left"
    )


def test_an_mcp_ask_whose_caller_left_closes_the_model_connection(stub_api):
    server, stub = stub_api
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "ask", "arguments": {"question": QUESTION}},
    }
    took = _wait_closed(stub, _post_and_leave(server, stub, "/mcp", call))
    print(f"\nMCP: model connection closed {took:.2f} s after the client left")
    assert took < CANCEL_BOUND, (
        f"the model connection stayed open {took:.1f} s after the MCP client left"
    )


def test_search_replaces_orders_in_passages_unless_raw(tmp_path):
    """A hostile abstract through `rag serve`: /v1/search marks its passages as untrusted document
    text and shows the order as a visible placeholder; `"raw": true` gives the text as stored.
    (Before issue 31 the order came back verbatim.)"""
    from rag import RAG
    from rag.answer.injection import PLACEHOLDER
    from tests.conftest import write_jsonl
    from tests.test_mcp import HOSTILE_ABSTRACT

    rows = [
        {
            "id": "hostile1",
            "title": "Sparse Routing Without Auxiliary Losses",
            "authors": ["A. Author"],
            "abstract": HOSTILE_ABSTRACT,
            "url": "https://openreview.net/forum?id=hostile1",
        }
    ]
    RAG(store_dir=tmp_path / "store").ingest(
        [write_jsonl(tmp_path / "hostile.jsonl", rows)], include_corpus=False
    )
    server = start_api(tmp_path / "store", tmp_path)
    try:
        with server.http() as http:
            guarded = http.post("/v1/search", json={"query": "sparse routing experts"})
            raw = http.post("/v1/search", json={"query": "sparse routing experts", "raw": True})
            bad = http.post("/v1/search", json={"query": "sparse routing experts", "raw": "yes"})
    finally:
        stop_process(server.proc)
    assert guarded.status_code == raw.status_code == 200 and bad.status_code == 422
    passage = guarded.json()["results"][0]["passage"]
    assert (
        PLACEHOLDER in passage and "OPENAI_API_KEY" not in passage and "40% less compute" in passage
    )
    assert "untrusted document text" in guarded.json()["untrusted"]
    assert "ignore all previous instructions" in raw.json()["results"][0]["passage"]
    flags = guarded.json()["sentences"][0]
    assert any(s["instruction"] and s["text"] == PLACEHOLDER for s in flags)
    assert [s["instruction"] for s in flags] == [
        s["instruction"] for s in raw.json()["sentences"][0]
    ]
