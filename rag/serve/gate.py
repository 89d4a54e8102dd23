"""The gate of `rag serve`: what a request passes before a route answers it, and how errors are
answered, so that no route repeats a check and no traceback reaches a client.

`Gate` (ASGI middleware) checks the bearer key (every route but /healthz) and the body size;
`bounded_head_settings` bounds the request head in uvicorn; `read_json` and `validate` read the
body; `ApiError`, `engine_error` and `endpoint` give every error OpenAI's shape. Limits and status
codes: docs/http-api.md. The argument checks shared with MCP: `rag.serve.requests`. uvicorn's own
settings cannot replace the head bounds: h11's size limit let a 10 kB URL, 150 headers or a head
trickled a byte at a time through, and uvicorn has no timeout for reading a head.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rag.errors import InputError, RagError, StoreError
from rag.serve.requests import BadRequest, one_line

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "ApiError",
    "Gate",
    "MESSAGE_LIMIT",
    "bounded_head_settings",
    "endpoint",
    "engine_error",
    "read_json",
    "validate",
]

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 1000  # characters of an error message a client is sent

# The request head, bounded before any key check or route (uvicorn keeps headers in memory
# unbounded): browsers and the openai client send well under 8 kB; nginx's defaults are 8 kB lines
# and 32 kB headers.
MAX_REQUEST_LINE = 8 * 1024
MAX_HEADER_COUNT = 100
MAX_HEAD_BYTES = 64 * 1024  # the request line and all the headers
HEAD_TIMEOUT = 30.0  # seconds a client gets to send a whole request head (a trickle ends here)
# after a refused head: what the client still sends is
LINGER_SECONDS, LINGER_BYTES = 1.0, 1024 * 1024
# read and dropped for this long, up to this much, so that the answer reaches it before the
# connection closes


# ---- errors
# ---------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, one_line(message, MESSAGE_LIMIT), type_
        self.param, self.code = param, code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def engine_error(exc: BaseException) -> ApiError:
    """What an exception from the engine becomes: the user's mistake (400), an unreadable store
    (503), anything else a one-line 500 (logged with its traceback)."""
    if isinstance(exc, ApiError):
        return exc
    # an argument that failed its check (rag.serve.requests): named in `param`
    if isinstance(exc, BadRequest):
        return ApiError(400, str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, InputError):
        return ApiError(400, str(exc), code="invalid_value")
    if isinstance(exc, StoreError):
        log.error("store error: %s", exc)
        return ApiError(503, str(exc), type_="server_error", code="store_unavailable")
    if isinstance(exc, RagError):
        log.error("engine error: %s", exc)
        return ApiError(500, str(exc), type_="server_error", code="engine_error")
    log.error("unexpected error while answering", exc_info=exc)
    return ApiError(
        500,
        f"the server failed to answer ({type(exc).__name__}); the server log has the details",
        type_="server_error",
        code="internal_error",
    )


def endpoint(
    fn: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A route whose every exception is answered by `engine_error`'s mapping."""

    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as exc:  # never a traceback to the client
            return engine_error(exc).response()

    wrapper.__name__ = fn.__name__
    return wrapper


# ---- the gate: key and body size, before anything else ------------------------------------------


class Gate:
    """ASGI middleware: the bearer key on every route but /healthz (compared in constant time),
    and the body size: a Content-Length over the limit is refused before a byte is read, a
    chunked body as soon as it passes it."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int) -> None:
        self.app, self.max_body = app, max_body
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # No route speaks websocket (the MCP endpoint is HTTP): refused before the key check or
            # a route (uvicorn answers the handshake with 403), never a traceback per request.
            await send(
                {
                    "type": "websocket.close",
                    "code": 1008,
                    "reason": "this server does not speak websocket",
                }
            )
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await refusal.response()(scope, receive, send)
            return
        seen, started = 0, False

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _too_large(self.max_body)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        # raised from counted_receive inside an app that did not answer it (/mcp)
        except ApiError as exc:
            if started:
                raise
            await exc.response()(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, bytes]) -> ApiError | None:
        if self.key is not None and scope.get("path", "") != "/healthz":
            scheme, _, token = (
                headers.get("authorization", b"").decode("latin-1").strip().partition(" ")
            )
            if scheme.lower() != "bearer" or not token.strip():
                return ApiError(
                    401,
                    "no API key: send the server's RAG_API_KEY as `Authorization: Bearer <key>`",
                    code="invalid_api_key",
                )
            if not hmac.compare_digest(token.strip().encode("latin-1"), self.key):
                return ApiError(
                    401,
                    "incorrect API key: send the server's RAG_API_KEY as "
                    "`Authorization: Bearer <key>`",
                    code="invalid_api_key",
                )
        length = headers.get("content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                return ApiError(400, "the Content-Length header is not a number")
            if size > self.max_body:
                return _too_large(self.max_body)
        return None


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is over {limit // 1024} kB; send a shorter question or history",
        code="request_too_large",
    )


# ---- the request body ---------------------------------------------------------------------------


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object, read up to `limit` bytes (413 past it, 400 empty or not a JSON
    object)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    if not body.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        data = json.loads(bytes(body))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            400, f"the request body is not valid JSON ({exc})", code="invalid_json"
        ) from None
    except RecursionError:
        raise ApiError(
            400, "the request body is not valid JSON (nested too deeply)", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise ApiError(
            400,
            f"the request body must be a JSON object, got a JSON {type(data).__name__}",
            code="invalid_json",
        )
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    """`data` as the request model: its first error a 400 (a missing field) or a 422 (a wrong
    type)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        if err["type"] == "missing":
            raise ApiError(
                400,
                f"missing required parameter {param!r}",
                param=param,
                code="missing_required_parameter",
            ) from None
        raise ApiError(
            422, f"{param}: {err['msg']}" if param else err["msg"], param=param, code="invalid_type"
        ) from None


# ---- the request head, bounded
# ----------------------------------------------------------------------


def bounded_head_settings() -> dict[str, Any]:
    """uvicorn settings that bound a request's head before the app sees it: with httptools
    (uvicorn's default when installed) a protocol that answers 431 once the request line, the
    header count or the head's size passes its limit, and 408 when the head takes over
    HEAD_TIMEOUT seconds; with h11 its incomplete-event limit (answered 400 by uvicorn)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return {"http": "h11", "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
    return {"http": _bounded_httptools_protocol()}


def _head_refusal(status: int, message: str, code: str) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection:"
        b" close\r\n\r\n" % (status, reason, len(body)) + body
    )


class _HeadTooLarge(Exception):
    """Raised from an httptools callback: the parser stops, the connection gets a 431."""


def _bounded_httptools_protocol() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with the head bounded. httptools gathers a header's value
        in memory however long it grows, so bytes are counted as they arrive, before the parser
        keeps them: at most MAX_HEAD_BYTES plus one read per connection."""

        _reading_head = True
        _head_bytes = 0
        _head_timer: asyncio.TimerHandle | None = None
        _refused = False
        # (message, code) of a head a parser callback refused
        _refusal: tuple[str, str] | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_timed_out)

        def data_received(self, data: bytes) -> None:
            if self._refused:  # lingering: dropped, up to a bound
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES + LINGER_BYTES:
                    self.transport.close()
                return
            if self._reading_head:
                if self._head_timer is None:
                    self._head_timer = self.loop.call_later(HEAD_TIMEOUT, self._head_timed_out)
                self._head_bytes += len(data)
            try:
                super().data_received(data)
            # raised when the parser had already stopped (not through a callback)
            except _HeadTooLarge:
                pass
            if not self._refused and self._reading_head and self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(
                    431,
                    f"the request headers are over {MAX_HEAD_BYTES // 1024} kB; send fewer or "
                    "shorter headers",
                    "request_headers_too_large",
                )

        def send_400_response(self, msg: str) -> None:
            cause = self._refusal
            if cause is not None:  # the parser stopped because a callback refused the head
                self._refuse(431, *cause)
            else:
                super().send_400_response(msg)

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > MAX_REQUEST_LINE:
                self._refusal = (
                    f"the request line is over {MAX_REQUEST_LINE // 1024} kB; send a shorter URL",
                    "request_line_too_long",
                )
                raise _HeadTooLarge()

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            if len(self.headers) > MAX_HEADER_COUNT:
                self._refusal = (
                    f"the request has over {MAX_HEADER_COUNT} headers; send fewer",
                    "too_many_headers",
                )
                raise _HeadTooLarge()

        def on_headers_complete(self) -> None:
            # The whole head may have come in one read: measured again here, before the app is
            # called.
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > MAX_HEAD_BYTES:
                self._refusal = (
                    f"the request headers are over {MAX_HEAD_BYTES // 1024} kB; send fewer or "
                    "shorter headers",
                    "request_headers_too_large",
                )
                raise _HeadTooLarge()
            self._head_done()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._reading_head, self._head_bytes = True, 0  # a pipelined or kept-alive next request

        def connection_lost(self, exc: Exception | None) -> None:
            self._head_done()
            super().connection_lost(exc)

        def _head_done(self) -> None:
            self._reading_head = False
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self._reading_head and not self._refused and self._head_bytes:
                self._refuse(
                    408,
                    f"the request head took over {HEAD_TIMEOUT:g} s to arrive",
                    "request_timeout",
                )
            elif self._reading_head and not self._refused:
                self.transport.close()  # connected and silent: just closed

        def _refuse(self, status: int, message: str, code: str) -> None:
            self._refused = True
            self._head_done()
            if self.transport.is_closing():
                return
            self.transport.write(_head_refusal(status, message, code))
            if self.transport.can_write_eof():
                # A lingering close (see LINGER_SECONDS): an immediate one would reset a client that
                # is still sending before it reads the answer.
                self.transport.write_eof()
                self.loop.call_later(LINGER_SECONDS, self.transport.close)
            else:
                self.transport.close()

    return BoundedHttpToolsProtocol
