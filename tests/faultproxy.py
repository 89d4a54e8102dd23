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
- ``delay(seconds, times)``: wait, then forward (skipped when the client has already hung up).
- ``cut_stream(after_events, times)``: forward a streamed (SSE) response's first N events, then
  close the connection without ending the chunked body (a server killed mid-stream).
- ``clear()``: pass everything through again.

Pass-through streams chunked/SSE bodies event by event (never buffered whole); each response
closes its connection; an unreachable upstream gets 502. ``requests`` records (time, method,
path, headers, fault) per request; ``cuts`` counts streams actually cut. ``stop()`` (or leaving
the ``with``) ends pending delays and shuts the server down.
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

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te",
       "upgrade", "host"}


@dataclass
class Fault:
    status: int | None = None  # answer this status instead of forwarding
    retry_after: str | None = None  # Retry-After header of that answer
    delay: float = 0.0  # seconds to wait before forwarding
    cut_after: int | None = None  # SSE events to forward before cutting the connection
    echo_auth: bool = False  # repeat the Authorization header in the error message


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
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"faultproxy-{self.port}", daemon=True)
        self._thread.start()

    # ---- scripting
    def add(self, fault: Fault, times: int | None = 1) -> FaultProxy:
        with self._lock:
            self._plan.append([fault, times])
        return self

    def fail(self, status: int, times: int | None = 1, retry_after: str | None = "1",
             echo_auth: bool = False) -> FaultProxy:
        return self.add(Fault(status=status, retry_after=retry_after if status == 429 else None,
                              echo_auth=echo_auth), times)

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
            self.requests.append({"time": time.monotonic(), "method": method, "path": path,
                                  "headers": headers, "fault": fault})
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


def _handler(proxy: FaultProxy):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _client_gone(self) -> bool:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""

        def _error(self, status: int, msg: str, retry_after: str | None = None) -> None:
            data = json.dumps({"error": {"message": msg, "type": "fault_proxy", "code": status}}).encode()
            self.send_response(status)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            for k, v in (("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                         ("Connection", "close")):
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            fault = proxy._next(self.command, self.path, dict(self.headers.items())) or Fault()
            self.close_connection = True
            conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=proxy.timeout)
            try:
                if fault.delay and (proxy._stopping.wait(fault.delay) or self._client_gone()):
                    return
                if fault.status is not None:
                    auth = f" (request authorization: {self.headers.get('Authorization')})"
                    return self._error(fault.status, f"injected fault: HTTP {fault.status}"
                                       + (auth if fault.echo_auth else ""), fault.retry_after)
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
                        return self.connection.shutdown(socket.SHUT_RDWR)  # no 0-chunk: body incomplete
                    if not line:
                        break
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client hung up (e.g. it timed out): nothing more to send
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

    return Handler
