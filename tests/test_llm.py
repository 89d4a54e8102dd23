"""The LLM path against a real OpenAI-compatible server (llama.cpp's, SmolLM2-135M) on loopback.

The tiny model's wording is not asserted (it is demo quality); the structure is: streaming, usage,
citations that map to sources, and clear errors with the sources still shown. Where the prompt's
size is not the point, its sources get 400 tokens (`SHORT_PROMPT`) instead of the default 3,000: the
tiny model reads a cold prompt at ~150 tokens/s on one CPU thread, which was most of these tests'
time.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from rag import RAG, Answer
from rag.prompts import FALLBACK_LABEL
from tests.conftest import REPO, run_cli

SHORT_PROMPT = 400  # llm_context_tokens where the prompt's size is not what a test checks
# The llama server with an API key: test_hostile.py asks it with the same key, so the session starts
# one.
API_KEY = "sk-test-KEY-4242"
# llama.cpp in this process on one thread, as tests/harness.py runs the server: with both cores busy
# (another test worker, other processes) two spinning threads collide. An answer of the in-process
# model took 53 s (20.6 s CPU) on two threads and 16 s (7.8 s CPU) on one, on this 2-core machine at
# load 10.
LOCAL_THREADS = 1


def _llm_rag(seed_store, **kw) -> RAG:
    return RAG(store_dir=seed_store, **{"llm_context_tokens": SHORT_PROMPT, **kw})


def _check_citations_map_to_sources(answer: Answer) -> None:
    markers = {int(n) for n in re.findall(r"\[(\d+)\]", answer.answer)}
    cited = {s.n for s in answer.sources if s.cited}
    assert markers == cited == {c.n for c in answer.citations}
    assert sorted(cited) == list(range(1, len(cited) + 1))
    assert sorted(s.n for s in answer.sources) == list(range(1, len(answer.sources) + 1))


def test_streamed_llm_answer_with_checked_citations(seed_store, llama_server):
    rag = _llm_rag(
        seed_store,
        openai_base_url=llama_server.base_url,
        llm_model=llama_server.model,
        llm_max_tokens=96,
    )
    assert rag.settings.llm_backend == "openai"
    stream = rag.stream("How does Palimpsa relate to Mamba2?")
    pieces = list(stream)
    answer = stream.answer
    assert isinstance(answer, Answer) and answer.error is None and answer.mode == "llm"
    # "" (reading the sources), then the checked text: joined, the answer
    assert len(pieces) > 1 and pieces[0] == "" and "".join(pieces) == answer.answer
    assert (
        answer.usage is not None
        and answer.usage.prompt_tokens > 100
        and answer.usage.completion_tokens > 0
    )
    assert len(answer.sources) == 5 and answer.sources  # every retrieved paper is listed
    _check_citations_map_to_sources(answer)


def test_rag_ask_json_through_the_cli(seed_store, llama_server):
    env = {
        "OPENAI_BASE_URL": llama_server.base_url,
        "RAG_LLM_MODEL": llama_server.model,
        "RAG_LLM_MAX_TOKENS": "64",
        "RAG_LLM_CONTEXT_TOKENS": str(SHORT_PROMPT),
    }
    proc = run_cli("ask", "What does Palimpsa use?", "--json", "--store", str(seed_store), env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mode"] == "llm" and data["error"] is None
    assert data["usage"]["total_tokens"] > 0
    _check_citations_map_to_sources(Answer.model_validate(data))
    # --no-llm forces the extractive answer even with an LLM configured.
    proc = run_cli(
        "ask", "What does Palimpsa use?", "--json", "--no-llm", "--store", str(seed_store), env=env
    )
    assert json.loads(proc.stdout)["mode"] == "extractive"


def test_wrong_api_key_is_a_clear_error_and_sources_stay(seed_store, llama_server_factory):
    server = llama_server_factory(api_key=API_KEY)
    secret = "sk-wrong-secret-456"
    env = {
        "OPENAI_BASE_URL": server.base_url,
        "RAG_LLM_MODEL": server.model,
        "OPENAI_API_KEY": secret,
        "RAG_LLM_RETRIES": "0",
    }
    proc = run_cli(
        "ask", "How does Palimpsa relate to Mamba2?", "--store", str(seed_store), env=env
    )
    assert proc.returncode == 0
    assert "rejected the API key (401); check OPENAI_API_KEY" in proc.stderr
    assert "References:" in proc.stdout and "[1]" in proc.stdout  # extractive fallback with sources
    assert secret not in proc.stdout + proc.stderr
    # With the right key it answers through the LLM.
    ok = _llm_rag(
        seed_store,
        openai_base_url=server.base_url,
        llm_model=server.model,
        openai_api_key=API_KEY,
        llm_max_tokens=32,
    ).ask("What is Palimpsa?")
    assert ok.error is None and ok.mode == "llm"


def test_unreachable_server_falls_back_to_extractive(seed_store):
    from tests.servers import free_port

    rag = _llm_rag(
        seed_store,
        openai_base_url=f"http://127.0.0.1:{free_port()}/v1",
        llm_model="m",
        llm_retries=0,
        llm_timeout=5,
    )
    answer = rag.ask("How does Palimpsa relate to Mamba2?")
    assert answer.mode == "extractive" and answer.error.startswith(
        "cannot connect to the LLM endpoint"
    )
    assert answer.answer.startswith(FALLBACK_LABEL)  # never labelled "no LLM configured"
    assert "check OPENAI_BASE_URL" in answer.error
    assert answer.sources[0].paper_id == "wKMV7mXjUr" and answer.citations


@pytest.mark.slow
def test_local_in_process_model(seed_store):
    """RAG_LLM=local runs a GGUF in-process with llama-cpp-python (the tiny SmolLM2 here, for
    speed)."""
    from tests.servers import find_gguf

    rag = RAG(
        store_dir=seed_store,
        llm="local",
        local_model_path=find_gguf(),
        llm_max_tokens=24,
        llm_context_tokens=SHORT_PROMPT,
        llm_threads=LOCAL_THREADS,
    )
    answer = rag.stream("What does Palimpsa use?").answer
    assert answer.error is None and answer.mode == "llm", answer.error
    assert rag.llm.label.endswith("(local, llama-cpp-python)")
    assert answer.usage.estimated and answer.usage.cost_usd == 0.0
    _check_citations_map_to_sources(answer)


def test_missing_local_model_is_a_clear_fallback(seed_store, tmp_path):
    rag = RAG(store_dir=seed_store, llm="local", local_model_path=tmp_path / "nope.gguf")
    answer = rag.ask("What does Palimpsa use?")
    try:  # without llama-cpp-python (the fast tier's install) the one line names that instead
        import llama_cpp  # noqa: F401

        fix = "set RAG_LOCAL_MODEL_PATH"
    except ImportError:
        fix = "RAG_LLM=local needs llama-cpp-python: pip install -e '.[local]'"
    assert answer.mode == "extractive" and fix in answer.error


def test_cli_streams_the_answer_then_references(seed_store, llama_server):
    """`rag ask` prints the answer as it arrives; what it printed is what the final answer says."""
    import subprocess
    import time

    env = {
        "OPENAI_BASE_URL": llama_server.base_url,
        "RAG_LLM_MODEL": llama_server.model,
        "RAG_LLM_MAX_TOKENS": "96",
        "RAG_LLM_CONTEXT_TOKENS": str(SHORT_PROMPT),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rag.cli",
            "ask",
            "How does Palimpsa relate to Mamba2?",
            "--store",
            str(seed_store),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **env},
    )
    arrivals = []
    start = time.monotonic()
    while True:
        chunk = os.read(proc.stdout.fileno(), 64)
        if not chunk:
            break
        arrivals.append((time.monotonic() - start, chunk.decode("utf-8", "replace")))
    proc.wait(timeout=60)
    out = "".join(c for _, c in arrivals)
    assert proc.returncode == 0, proc.stderr.read()
    assert len(arrivals) > 3  # several writes, not one at the end
    assert "Nearest papers:" in out or "References:" in out
    body = out.split("\n\nReferences:")[0].split("\n\nNearest papers:")[0].strip()
    assert body
    # Every marker printed in the streamed text has its reference printed below it.
    references = out.split(body, 1)[1]
    assert all(f"[{n}]" in references for n in {int(x) for x in re.findall(r"\[(\d+)\]", body)})


@pytest.mark.slow  # a server process (the fast tier runs none)
def test_server_killed_mid_stream(seed_store):
    """A server process killed while it streams: the answer says so and falls back. The process
    is the scripted model (`python -m tests.faultproxy`: 400 words, one per 50 ms), not
    llama.cpp: what is checked is the connection dying mid-answer, and a fresh llama.cpp process
    took seconds to start and read its prompt."""
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faultproxy"], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        rag = RAG(
            store_dir=seed_store,
            openai_base_url=url + "/v1",
            llm_model="stub-model",
            llm_context_tokens=400,
            llm_max_tokens=256,
            llm_retries=0,
        )
        pieces = []
        stream = rag.stream("How does Palimpsa relate to Mamba2?")
        for piece in stream:
            pieces.append(piece)
            if len(pieces) == 2:
                proc.kill()
    finally:
        proc.kill()
        proc.wait(10)
    answer = stream.answer
    assert isinstance(answer, Answer) and answer.mode == "extractive"
    assert "broke off" in answer.error and "OPENAI_BASE_URL" in answer.error
    assert answer.answer.startswith(FALLBACK_LABEL) and answer.sources[0].paper_id == "wKMV7mXjUr"


def test_make_llm_picks_a_chat_model(tmp_path):
    """rag/backends/chat.py without a server: the backend for the settings, and the pure helpers
    (price table, yes/no share). Making an OpenAIChat connects to nothing."""
    from rag.backends.chat import (
        ChatModel,
        LocalChat,
        OpenAIChat,
        estimate_cost,
        make_llm,
        yes_share,
    )
    from rag.config import Settings

    assert make_llm(Settings(store_dir=tmp_path, llm="none")) is None
    chat = make_llm(
        Settings(
            store_dir=tmp_path,
            llm="openai",
            openai_base_url="http://user:pw@127.0.0.1:9/v1",
            llm_model="m",
        )
    )
    assert isinstance(chat, OpenAIChat) and isinstance(chat, ChatModel)
    # not OpenAI: no price
    assert chat.label == "m at http://***@127.0.0.1:9/v1" and chat.cost(1000, 1000) is None
    for name in ("label", "check_model", "stream", "complete", "yes_probability", "cost"):
        assert hasattr(LocalChat, name), name
    assert estimate_cost("gpt-4o-mini", None, 1_000_000, 1_000_000) == 0.75
    assert (
        estimate_cost("gpt-4o-mini-2024-07-18", "https://api.openai.com/v1", 1_000_000, 0) == 0.15
    )
    assert estimate_cost("no-such-model", None, 10, 10) is None
    assert estimate_cost("gpt-4o", "http://127.0.0.1:8080/v1", 10, 10) is None
    assert yes_share([("Yes", 0.0), (" no", 0.0)], "") == 0.5
    assert yes_share([], "No.") == 0.0 and yes_share([], "yes") == 1.0


def _llamaindex_llm(base_url: str, model: str):
    """A LlamaIndex `LLM` an app might already have, talking to the real server (written out: the
    OpenAILike package is not a dependency)."""
    import openai
    from llama_index.core.llms import (
        ChatMessage,
        ChatResponse,
        CompletionResponse,
        CustomLLM,
        LLMMetadata,
    )

    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=30)

    class AppLLM(CustomLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata(model_name=model, is_chat_model=True)

        def complete(self, prompt: str, formatted: bool = False, **kw) -> CompletionResponse:
            raise NotImplementedError("chat only")

        def stream_complete(self, prompt: str, formatted: bool = False, **kw):
            raise NotImplementedError("chat only")

        def chat(self, messages, **kw) -> ChatResponse:
            reply = client.chat.completions.create(
                model=model,
                max_tokens=64,
                temperature=0,
                messages=[{"role": m.role.value, "content": m.content} for m in messages],
            )
            return ChatResponse(
                message=ChatMessage(role="assistant", content=reply.choices[0].message.content)
            )

        def stream_chat(self, messages, **kw):
            text = ""
            for chunk in client.chat.completions.create(
                model=model,
                max_tokens=64,
                temperature=0,
                stream=True,
                messages=[{"role": m.role.value, "content": m.content} for m in messages],
            ):
                delta = chunk.choices[0].delta.content or "" if chunk.choices else ""
                text += delta
                yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=delta)

    return AppLLM()


def test_an_app_passes_its_own_llamaindex_llm(seed_store, llama_server):
    """`RAG(llm=<LlamaIndex LLM>)`: answers stream through it, checked like the built-in
    backends; when it fails, the answer falls back to quotes and says which model failed."""
    rag = RAG(
        store_dir=seed_store,
        llm=_llamaindex_llm(llama_server.base_url, llama_server.model),
        llm_context_tokens=SHORT_PROMPT,
    )
    assert rag.has_llm and rag.settings.llm_backend == "none"  # the instance wins over the settings
    stream = rag.stream("How does Palimpsa relate to Mamba2?")
    pieces = list(stream)
    answer = stream.answer
    assert answer.mode == "llm" and answer.error is None, answer.error
    assert pieces[0] == "" and "".join(pieces).strip()
    _check_citations_map_to_sources(answer)

    broken = RAG(store_dir=seed_store, llm=_llamaindex_llm("http://127.0.0.1:9/v1", "m"))
    answer = broken.ask("How does Palimpsa relate to Mamba2?")
    assert answer.mode == "extractive" and "AppLLM" in answer.error and answer.sources


def test_llm_and_embedder_arguments_are_checked(tmp_path):
    from rag.errors import InputError

    with pytest.raises(InputError, match="llm must be 'openai', 'local', 'none', a LlamaIndex LLM"):
        RAG(store_dir=tmp_path, llm=42)
    with pytest.raises(InputError, match="invalid setting llm"):
        RAG(store_dir=tmp_path, llm="gpt")
    with pytest.raises(InputError, match="embedder must be a LlamaIndex BaseEmbedding"):
        RAG(store_dir=tmp_path, embedder=object())


# ---- cancellation: a reader that leaves stops the local token loop
# ----------------------------------


class _RecordingChat:
    """The product's ChatModel seam around a real backend (plumbing): passes everything through
    and records when each token came out of the backend's loop and whether the loop ended by
    itself."""

    def __init__(self, inner) -> None:
        self.inner, self.tokens, self.ended, self.finished = inner, [], None, False
        self.label, self.check_model, self.complete = inner.label, inner.check_model, inner.complete
        self.yes_probability, self.cost = inner.yes_probability, inner.cost

    def stream(self, messages):
        import time

        try:
            for piece in self.inner.stream(messages):
                self.tokens.append(time.monotonic())
                yield piece
            self.finished = True
        finally:
            self.ended = time.monotonic()


COUNT = [{"role": "user", "content": "Count from 1 to 400, one number per line, and nothing else."}]


@pytest.mark.slow
def test_a_cancelled_local_stream_stops_llama_cpp_within_a_token(tmp_path):
    """Real llama.cpp in-process (SmolLM2-135M): cancelled from another thread mid-answer, the
    token loop stops before its next token and raises GenerationCancelled; the model then answers
    the next call."""
    import threading
    import time

    from rag.backends.chat import Cancellation, GenerationCancelled, LocalChat
    from rag.config import Settings
    from tests.servers import find_gguf

    chat = _RecordingChat(
        LocalChat(
            Settings(
                llm="local",
                local_model_path=find_gguf(),
                llm_max_tokens=1500,
                store_dir=tmp_path,
                llm_threads=LOCAL_THREADS,
            )
        )
    )
    cancellation, outcome = Cancellation(), {}

    def read() -> None:
        with cancellation.applied():
            try:
                for _ in chat.stream(COUNT):
                    pass
                outcome["result"] = "finished"
            except GenerationCancelled:
                outcome["result"] = "cancelled"

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 120
    while len(chat.tokens) < 20 and time.monotonic() < deadline and reader.is_alive():
        time.sleep(0.01)
    assert len(chat.tokens) >= 20 and not chat.finished, (
        "the model ended its answer before the test could cancel"
    )
    cancelled_at = time.monotonic()
    cancellation.cancel()
    # a bound, not a timing: under heavy load the loop takes longer to see the flag
    reader.join(120)
    assert outcome.get("result") == "cancelled"
    after = [t for t in chat.tokens if t > cancelled_at]
    print(
        f"\nlocal: loop ended {chat.ended - cancelled_at:.3f} s after cancel; {len(after)} token(s)"
        f" after it, {len(chat.tokens)} in all"
    )
    assert len(after) <= 1 and chat.ended - cancelled_at < 1.0
    # The model is free again and its cache consistent: the next call answers.
    assert chat.inner.complete([{"role": "user", "content": "Say hi."}]).strip()


@pytest.mark.slow
def test_a_local_stream_cancelled_while_reading_its_prompt_stops_at_the_next_batch(tmp_path):
    """Cancelled before the first token, while llama.cpp reads a long prompt in 512-token
    batches: it stops at the next batch (not after reading the whole prompt and answering)."""
    import time

    from rag.backends.chat import Cancellation, GenerationCancelled, LocalChat
    from rag.config import Settings
    from tests.servers import find_gguf

    chat = LocalChat(
        Settings(
            llm="local",
            local_model_path=find_gguf(),
            llm_max_tokens=64,
            store_dir=tmp_path,
            llm_context_tokens=3000,
            llm_threads=LOCAL_THREADS,
        )
    )
    decodes = []
    decode = chat._llm._ctx.decode
    chat._llm._ctx.decode = lambda batch: (decodes.append(time.monotonic()), decode(batch))[1]
    long_prompt = [
        {"role": "user", "content": "Summarise: " + "the model reads every word of this. " * 300}
    ]
    cancellation = Cancellation()
    with cancellation.applied():
        stream = chat.stream(long_prompt)
        import threading

        threading.Timer(0.05, cancellation.cancel).start()
        with pytest.raises(GenerationCancelled):
            for _ in stream:
                pass
    # the prompt needs 5
    assert len(decodes) <= 2, f"{len(decodes)} batches decoded after the cancel"


class _LongAnswerChat(_RecordingChat):
    """As `_RecordingChat`, and asks the model to count (plumbing): a tiny model's own answers
    can end before a test client has left; this one runs for ~1,500 tokens unless stopped."""

    def stream(self, messages):
        return super().stream(COUNT)


@pytest.mark.slow
def test_a_dropped_http_stream_stops_the_local_token_loop(seed_store):
    """`rag serve`'s app on loopback (uvicorn in this process, so the ChatModel seam can be
    watched) over a real in-process llama.cpp model: a client that drops a streamed answer stops
    the token loop."""
    import threading
    import time

    import httpx
    import uvicorn

    from rag.backends.chat import LocalChat
    from rag.config import Settings
    from rag.serve.http import make_app
    from tests.harness import free_port
    from tests.servers import find_gguf

    chat = _LongAnswerChat(
        LocalChat(
            Settings(
                llm="local",
                local_model_path=find_gguf(),
                llm_max_tokens=1500,
                store_dir=seed_store,
                llm_threads=LOCAL_THREADS,
            )
        )
    )
    rag = RAG(store_dir=seed_store, llm=chat, llm_check=False)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(rag, mcp=False), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        body = {
            "model": "rag",
            "stream": True,
            "messages": [{"role": "user", "content": "What does Palimpsa use?"}],
        }
        with httpx.Client(trust_env=False, timeout=120) as http:
            with http.stream(
                "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body
            ) as r:
                assert r.status_code == 200
                deadline = time.monotonic() + 120
                while len(chat.tokens) < 20 and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert len(chat.tokens) >= 20 and not chat.finished
        left = time.monotonic()
        deadline = left + 15
        while chat.ended is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        server.should_exit = True
        thread.join(120)
    assert chat.ended is not None and not chat.finished, (
        "the token loop ran on after the client left"
    )
    after = [t for t in chat.tokens if t > left]
    print(
        f"\nlocal over HTTP: token loop ended {chat.ended - left:.3f} s after the client left; "
        f"{len(after)} token(s) after it"
    )
    assert chat.ended - left < 3.0
