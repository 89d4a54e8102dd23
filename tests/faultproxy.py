"""A small fault-injecting HTTP proxy on loopback, for testing LLM-endpoint failures.

llama-cpp-python's server never returns 429/5xx, stalls or dies mid-stream on request; put this in
front of it instead::

    with fault_proxy(llama_server.url) as proxy:      # upstream "http://127.0.0.1:PORT"
        proxy.fail(429, times=2)                       # next 2 matching requests get 429, then pass
        rag = RAG(openai_base_url=proxy.url + "/v1", ...)
        ...
        assert proxy.count() == 3                      # matching requests seen (retries included)

Faults (each applies to the next ``times`` requests whose path contains ``match``, default
"/chat/completions"; ``times=None`` means every such request from now on; other requests such as
``/v1/models`` always pass through):

- ``fail(status, times, retry_after="1")``: answer ``status`` with an OpenAI-style JSON error
  (429 carries ``Retry-After``); ``echo_auth=True`` puts the request's Authorization header in the
  error message, as some real servers do, to check that clients never repeat it.
- ``reply(body, times)``: answer 200 with ``body`` (garbage, or JSON of the wrong shape).
- ``delay(seconds, times)``: wait, then forward (skipped when the client has already hung up).
- ``cut_stream(after_events, times)``: forward a streamed (SSE) response's first N events, then
  close the connection without ending the chunked body (a server killed mid-stream).
- ``clear()``: pass everything through again.

Pass-through streams chunked/SSE bodies event by event (never buffered whole); each response
closes its connection; an unreachable upstream gets 502. ``requests`` records (time, method,
path, headers, fault) per request; ``cuts`` counts streams actually cut. ``stop()`` (or leaving
the ``with``) ends pending delays and shuts the server down.

``ModelStub`` (below) is a scripted slow model on loopback for cancellation tests: it streams a
fixed text word by word and records, per streamed completion, when its client closed the connection.
``python -m tests.faultproxy [--tokens N] [--interval S]`` runs one in a process of its own (it
prints its url, then serves until killed), for tests that kill the server mid-answer.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "proxy-connection",
    "te",
    "upgrade",
    "host",
}


@dataclass
class Fault:
    status: int | None = None  # answer this status instead of forwarding
    retry_after: str | None = None  # Retry-After header of that answer
    delay: float = 0.0  # seconds to wait before forwarding
    cut_after: int | None = None  # SSE events to forward before cutting the connection
    echo_auth: bool = False  # repeat the Authorization header in the error message
    body: bytes | None = None  # answer 200 with this body instead of forwarding


class FaultProxy:
    def __init__(self, upstream: str, match: str = "/chat/completions", timeout: float = 60.0):
        u = urlsplit(upstream)
        self.upstream_host, self.upstream_port = u.hostname or "127.0.0.1", u.port or 80
        self.match, self.timeout = match, timeout
        self.requests: list[dict] = []
        self.cuts = 0
        self._plan: list[list] = []  # [fault, remaining or None]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"faultproxy-{self.port}",
            daemon=True,
        )
        self._thread.start()

    # ---- scripting
    def add(self, fault: Fault, times: int | None = 1) -> FaultProxy:
        with self._lock:
            self._plan.append([fault, times])
        return self

    def fail(
        self,
        status: int,
        times: int | None = 1,
        retry_after: str | None = "1",
        echo_auth: bool = False,
    ) -> FaultProxy:
        return self.add(
            Fault(
                status=status,
                retry_after=retry_after if status == 429 else None,
                echo_auth=echo_auth,
            ),
            times,
        )

    def reply(self, body: bytes, times: int | None = 1) -> FaultProxy:
        """Answer 200 with `body` (e.g. garbage, or JSON of the wrong shape) instead of
        forwarding."""
        return self.add(Fault(body=body), times)

    def delay(self, seconds: float, times: int | None = 1) -> FaultProxy:
        return self.add(Fault(delay=seconds), times)

    def cut_stream(self, after_events: int, times: int | None = 1) -> FaultProxy:
        return self.add(Fault(cut_after=after_events), times)

    def clear(self) -> None:
        with self._lock:
            self._plan.clear()

    def count(self, path: str | None = None) -> int:
        """Requests seen whose path contains `path` (default: the faultable ones)."""
        needle = self.match if path is None else path
        return sum(needle in r["path"] for r in self.requests)

    def _next(self, method: str, path: str, headers: dict) -> Fault | None:
        with self._lock:
            fault = None
            if self.match in path and self._plan:
                entry = self._plan[0]
                fault = entry[0]
                if entry[1] is not None:
                    entry[1] -= 1
                    if entry[1] <= 0:
                        self._plan.pop(0)
            self.requests.append(
                {
                    "time": time.monotonic(),
                    "method": method,
                    "path": path,
                    "headers": headers,
                    "fault": fault,
                }
            )
            return fault

    # ---- lifecycle
    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def fault_proxy(upstream: str, **kwargs) -> Iterator[FaultProxy]:
    """A running `FaultProxy` in front of `upstream` ("http://127.0.0.1:PORT"), stopped on exit."""
    proxy = FaultProxy(upstream, **kwargs)
    try:
        yield proxy
    finally:
        proxy.stop()


def _readable(sock: socket.socket, wait: float) -> bool:
    """Whether `sock` has data (or EOF) within `wait` seconds. poll, not select: late in a long test
    run this process holds more than 1,024 descriptors, which select() refuses ("filedescriptor out
    of range")."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(wait * 1000))


def _handler(proxy: FaultProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _client_gone(self) -> bool:
            return _readable(self.connection, 0) and self.connection.recv(1, socket.MSG_PEEK) == b""

        def _error(self, status: int, msg: str, retry_after: str | None = None) -> None:
            data = json.dumps(
                {"error": {"message": msg, "type": "fault_proxy", "code": status}}
            ).encode()
            self.send_response(status)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            for k, v in (
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(data))),
                ("Connection", "close"),
            ):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            fault = proxy._next(self.command, self.path, dict(self.headers.items())) or Fault()
            self.close_connection = True
            conn = http.client.HTTPConnection(
                proxy.upstream_host, proxy.upstream_port, timeout=proxy.timeout
            )
            try:
                if fault.delay and (proxy._stopping.wait(fault.delay) or self._client_gone()):
                    return
                if fault.body is not None:
                    self.send_response(200)
                    for k, v in (
                        ("Content-Type", "application/json"),
                        ("Content-Length", str(len(fault.body))),
                        ("Connection", "close"),
                    ):
                        self.send_header(k, v)
                    self.end_headers()
                    return self.wfile.write(fault.body)
                if fault.status is not None:
                    auth = f" (request authorization: {self.headers.get('Authorization')})"
                    return self._error(
                        fault.status,
                        f"injected fault: HTTP {fault.status}" + (auth if fault.echo_auth else ""),
                        fault.retry_after,
                    )
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                except OSError as e:
                    return self._error(502, f"fault proxy: upstream unreachable ({e})")
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                if resp.getheader("Content-Length") is not None:  # a plain body: forward as is
                    data = resp.read()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return self.wfile.write(data)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sse = "text/event-stream" in (resp.getheader("Content-Type") or "")
                events, event = 0, b""
                while True:
                    line = resp.readline() if sse else resp.read1(65536)
                    if sse and line:  # an event ends at a blank line: forward whole events
                        event += line
                        if line.strip():
                            continue
                        events += 1
                    out, event = (event, b"") if sse else (line, b"")  # at EOF: what is left
                    if out:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(out), out))
                        self.wfile.flush()
                    if fault.cut_after is not None and events >= fault.cut_after:
                        with proxy._lock:
                            proxy.cuts += 1
                        # no 0-chunk: body incomplete
                        return self.connection.shutdown(socket.SHUT_RDWR)
                    if not line:
                        break
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client hung up (e.g. it timed out): nothing more to send
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

    return Handler


# ---- a slow scripted model: when did the client hang up?
# --------------------------------------------


@dataclass
class StubStream:
    """One streamed completion the stub served: when it started, when the client closed the
    connection (None: it did not while tokens were sent), when the stub stopped sending, and how
    many tokens it sent."""

    started: float
    client_closed: float | None = None
    ended: float | None = None
    tokens_sent: int = 0


class ModelStub:
    """A scripted OpenAI-compatible model on loopback (plumbing, not a model): `GET /v1/models`
    lists `model`; a streamed chat completion sends `text` word by word, one every `interval`
    seconds after `first_token_delay` (a model reading its prompt), up to `tokens` words; a plain
    one answers "yes". Between words it checks whether the client closed the connection and records
    when (`streams`), so a test can tell whether a client that stopped reading also stopped the
    model."""

    def __init__(
        self,
        text: str = "The papers say [1] that the method works well on long inputs.",
        tokens: int = 400,
        interval: float = 0.05,
        first_token_delay: float = 0.0,
        model: str = "stub-model",
    ) -> None:
        self.text, self.tokens, self.interval = text, tokens, interval
        self.first_token_delay, self.model = first_token_delay, model
        self.streams: list[StubStream] = []
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _stub_handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"model-stub-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def wait_stream(self, timeout: float = 60.0) -> StubStream:
        """The first streamed completion, once it has sent a token."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.streams and self.streams[0].tokens_sent:
                return self.streams[0]
            time.sleep(0.01)
        raise AssertionError("the model stub got no streamed completion")

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> ModelStub:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _stub_handler(stub: ModelStub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _json(self, data: dict) -> None:
            body = json.dumps(data).encode()
            self.send_response(200)
            for k, v in (("Content-Type", "application/json"), ("Content-Length", str(len(body)))):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _client_gone(self, wait: float) -> bool:
            if not _readable(self.connection, wait):
                return False
            try:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        def do_GET(self) -> None:
            self._json(
                {
                    "object": "list",
                    "data": [{"id": stub.model, "object": "model", "owned_by": "stub"}],
                }
            )

        def do_POST(self) -> None:
            request = json.loads(
                self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"
            )
            if not request.get("stream"):
                return self._json(
                    {
                        "id": "stub",
                        "object": "chat.completion",
                        "created": 0,
                        "model": stub.model,
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "logprobs": None,
                                "message": {"role": "assistant", "content": "yes"},
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                    }
                )
            record = StubStream(started=time.monotonic())
            stub.streams.append(record)
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            words = stub.text.split(" ")

            def event(data: dict | str) -> None:
                out = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(out), out))
                self.wfile.flush()

            def chunk(delta: dict, finish: str | None = None) -> dict:
                return {
                    "id": "stub",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": stub.model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }

            try:
                if self._client_gone(stub.first_token_delay):
                    record.client_closed = time.monotonic()
                    return
                event(chunk({"role": "assistant", "content": ""}))
                for i in range(stub.tokens):
                    if stub._stopping.is_set():
                        return
                    if self._client_gone(stub.interval):
                        record.client_closed = time.monotonic()
                        return
                    event(chunk({"content": words[i % len(words)] + " "}))
                    record.tokens_sent += 1
                event(chunk({}, "stop"))
                event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                record.client_closed = time.monotonic()
            finally:
                record.ended = time.monotonic()

    return Handler


def main(argv: list[str] | None = None) -> None:
    """A `ModelStub` in this process: prints its url ("http://127.0.0.1:PORT") on one line, serves
    until killed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.faultproxy", description=main.__doc__)
    parser.add_argument("--tokens", type=int, default=400, help="words per streamed answer")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between words")
    args = parser.parse_args(argv)
    stub = ModelStub(tokens=args.tokens, interval=args.interval)
    print(stub.url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
