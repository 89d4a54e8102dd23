"""`rag serve`: the engine as an OpenAI-compatible HTTP API (Starlette, served by uvicorn).

`make_app(rag)` builds the ASGI app; `serve(rag, host, port)` checks the binding, opens the index, and
runs it. Routes:

- `POST /v1/chat/completions`: the OpenAI request and response shapes, streamed (SSE chunks, then
  `data: [DONE]`) or not. The last user message is the question, the earlier user/assistant turns its
  history (a follow-up is rewritten into a standalone question). The text carries the `[n]` markers and
  ends with a plain "References:" block; the response (and the last chunk of a stream) carries an extra
  top-level key `rag` = `{"answer": <the rag ask --json object>}` with the sources and citations.
  Extension fields: `k` (papers to retrieve) and `mode` (retrieval mode). `model` is echoed back, whatever
  it is; other OpenAI fields (temperature, max_tokens...) are accepted and ignored.
- `POST /v1/search` `{query, k?, mode?}`: the `rag search --json` object (results in retrieval order; each
  one's `retrieval` holds its rank, the fused score the order follows, and its cosine and keyword matches).
- `GET /v1/papers/{paper_id}`: `{paper_id, title, authors, venue, year, url}` as `rag.metadata` builds it for
  every surface (venue "ICML 2026", year "2026"); 404 for an unknown id.
- `GET /v1/models`, `GET /v1/models/{id}`: the one model, "rag".
- `GET /healthz`: `{"status": "ok", "papers": N}` (never needs the key).
- `/mcp`: the MCP tools over streamable HTTP, when `rag.serve.mcp` provides them.

With `RAG_API_KEY` set every route but /healthz needs `Authorization: Bearer <key>`. Errors use OpenAI's
shape `{"error": {"message", "type", "param", "code"}}`: 400 bad input (the engine's `InputError` messages),
401, 404, 413 (a body over `MAX_BODY_BYTES`, refused before it is read whole), 422 (a field of the wrong
type), 503 (the store cannot be read), 500 (one line; the traceback goes to the server log only). Under
`serve`, a request head over `MAX_REQUEST_LINE`, `MAX_HEADER_COUNT` or `MAX_HEAD_BYTES` gets 431 before any
key check or route (`bounded_head_settings`); a websocket is refused (403).

The engine's calls block (embedding, SQLite, Chroma, an LLM): they run in worker threads, and a stream is
produced by a thread feeding the event loop, so one slow answer never holds up the others. All requests
share one `RAG` (thread-safe). A client that hangs up (streamed or not) cancels its answer: the model stops
within a token (`rag.backends.chat.Cancellation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rag.answer.citations import plain_text, reference_lines
from rag.answer.injection import UNTRUSTED_NOTE, guarded_source
from rag.answer.respond import clean_question
from rag.backends.chat import Cancellation, GenerationCancelled
from rag.config import check_k, check_mode, check_port_free, is_loopback
from rag.errors import InputError, RagError, StoreError
from rag.index.chunking import count_tiktoken
from rag.metadata import paper_metadata

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from rag.engine import RAG
    from rag.models import Answer

__all__ = ["MAX_BODY_BYTES", "MODEL_ID", "bounded_head_settings", "make_app", "serve"]

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

log = logging.getLogger(__name__)

MODEL_ID = "rag"
MAX_BODY_BYTES = 64 * 1024  # a question is at most 2,000 characters; a long chat history fits easily
# The request head, bounded before any key check or route (uvicorn keeps headers in memory unbounded):
# browsers and the openai client send well under 8 kB; nginx's defaults are 8 kB lines and 32 kB headers.
MAX_REQUEST_LINE = 8 * 1024
MAX_HEADER_COUNT = 100
MAX_HEAD_BYTES = 64 * 1024  # the request line and all the headers
HEAD_TIMEOUT = 30.0  # seconds a client gets to send a whole request head (a trickle ends here)
LINGER_SECONDS, LINGER_BYTES = 1.0, 1024 * 1024  # after a refused head: what the client still sends is
# read and dropped for this long, up to this much, so that the answer reaches it before the connection closes
_CREATED = int(time.time())
_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


# ---- errors ---------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, _one_line(message), type_, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _one_line(text: str, limit: int = 1000) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _engine_error(exc: BaseException) -> ApiError:
    """What an exception from the engine becomes: the user's mistake (400), an unreadable store (503),
    anything else a one-line 500 (logged with its traceback)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InputError):
        return ApiError(400, str(exc), code="invalid_value")
    if isinstance(exc, StoreError):
        log.error("store error: %s", exc)
        return ApiError(503, str(exc), type_="server_error", code="store_unavailable")
    if isinstance(exc, RagError):
        log.error("engine error: %s", exc)
        return ApiError(500, str(exc), type_="server_error", code="engine_error")
    log.error("unexpected error while answering", exc_info=exc)
    return ApiError(500, f"the server failed to answer ({type(exc).__name__}); the server log has the details",
                    type_="server_error", code="internal_error")


def _endpoint(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except Exception as exc:  # never a traceback to the client
            return _engine_error(exc).response()

    wrapper.__name__ = fn.__name__
    return wrapper


def _check(check: Callable[[Any], Any], value: object, param: str) -> Any:
    try:
        return check(value)
    except InputError as exc:
        raise ApiError(400, str(exc), param=param, code="invalid_value") from None


# ---- the gate: key and body size, before anything else ------------------------------------------


class _Gate:
    """ASGI middleware: the bearer key on every route but /healthz (compared in constant time), and the
    body size: a Content-Length over the limit is refused before a byte is read, a chunked body as soon as
    it passes it."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body: int) -> None:
        self.app, self.max_body = app, max_body
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # No route speaks websocket (the MCP endpoint is HTTP): refused before the key check or a route
            # (uvicorn answers the handshake with 403), never a traceback per request.
            await send({"type": "websocket.close", "code": 1008, "reason": "this server does not speak websocket"})
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
        except ApiError as exc:  # raised from counted_receive inside an app that did not answer it (/mcp)
            if started:
                raise
            await exc.response()(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[str, bytes]) -> ApiError | None:
        if self.key is not None and scope.get("path", "") != "/healthz":
            scheme, _, token = headers.get("authorization", b"").decode("latin-1").strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return ApiError(401, "no API key: send the server's RAG_API_KEY as `Authorization: Bearer <key>`",
                                code="invalid_api_key")
            if not hmac.compare_digest(token.strip().encode("latin-1"), self.key):
                return ApiError(401, "incorrect API key: send the server's RAG_API_KEY as "
                                "`Authorization: Bearer <key>`", code="invalid_api_key")
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
    return ApiError(413, f"the request body is over {limit // 1024} kB; send a shorter question or history",
                    code="request_too_large")


# ---- requests -------------------------------------------------------------------------------------


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: str
    content: Any = None  # a string or a list of content parts: checked by _text (a union's errors name its members)


class _ChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # temperature, max_tokens...: accepted, ignored
    messages: list[_Message]
    model: str | None = None
    stream: bool = False
    k: int | None = None
    mode: str | None = None


class _SearchRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    query: str
    k: int | None = None
    mode: str | None = None
    raw: bool = False  # passages as stored, instruction-like sentences kept (they stay untrusted text)


async def _read_json(request: Request, limit: int) -> dict[str, Any]:
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
        raise ApiError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON (nested too deeply)", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got a JSON {type(data).__name__}",
                       code="invalid_json")
    return data


def _validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        if err["type"] == "missing":
            raise ApiError(400, f"missing required parameter {param!r}", param=param,
                           code="missing_required_parameter") from None
        raise ApiError(422, f"{param}: {err['msg']}" if param else err["msg"], param=param,
                       code="invalid_type") from None


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise ApiError(422, f"{where}.content must be a string or a list of content parts",
                       param=f"{where}.content", code="invalid_type")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type")
        if kind != "text":
            raise ApiError(400, f"{where}.content[{i}] is a {kind!r} part; only text is supported",
                           param=f"{where}.content", code="unsupported_content")
        if not isinstance(part.get("text"), str):
            raise ApiError(422, f"{where}.content[{i}].text must be a string", param=f"{where}.content",
                           code="invalid_type")
        texts.append(part["text"])
    return "\n".join(texts)


def _strip_references(text: str) -> str:
    """An assistant turn as history: without the References block this API appended to it."""
    head, sep, _ = text.rpartition("\n\nReferences:\n")
    return head if sep else text


def _conversation(messages: list[_Message]) -> tuple[str, list[dict[str, str]], list[str]]:
    """(the question, the history before it, every message's text for the prompt count)."""
    for i, m in enumerate(messages):
        if m.role not in _ROLES:
            raise ApiError(400, f"messages.{i}.role must be one of {', '.join(_ROLES)}; got {m.role!r}",
                           param=f"messages.{i}.role", code="invalid_value")
    texts = [_text(m.content, f"messages.{i}") for i, m in enumerate(messages)]
    users = [i for i, m in enumerate(messages) if m.role == "user"]
    if not users:
        raise ApiError(400, "no user message: messages must hold at least one {\"role\": \"user\", \"content\": "
                       "<the question>}", param="messages", code="no_user_message")
    last = users[-1]
    history = [{"role": m.role, "content": _strip_references(texts[i]) if m.role == "assistant" else texts[i]}
               for i, m in enumerate(messages[:last]) if m.role in ("user", "assistant") and texts[i].strip()]
    return texts[last], history, texts


# ---- responses ------------------------------------------------------------------------------------


def _references(answer: Answer) -> str:
    """The cited sources as plain lines, "[n] Title — url", under "References:" ("" when none is cited)."""
    lines = reference_lines(answer)
    if not lines or lines[0] != "References:":
        return ""
    out = [lines[0]]
    for line in lines[1:]:
        if not line.startswith("["):
            break
        out.append(line)
    return "\n".join(out)


def _content(answer: Answer) -> str:
    refs = _references(answer)
    text = plain_text(answer.answer)
    return f"{text}\n\n{refs}" if refs else text


def _usage(answer: Answer, prompt_texts: list[str], content: str) -> dict[str, int]:
    """The LLM's usage when one ran; for an extractive answer, tiktoken counts of the request's messages
    and the returned text."""
    if answer.mode == "llm" and answer.usage is not None:
        u = answer.usage
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                "total_tokens": u.total_tokens or u.prompt_tokens + u.completion_tokens}
    prompt = sum(count_tiktoken(t) for t in prompt_texts)
    completion = count_tiktoken(content)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _rag_field(answer: Answer) -> dict[str, Any]:
    # The contract: `rag` holds exactly the object `rag ask --json` prints.
    return answer.model_dump(mode="json")


def _correction(answer: Answer, streamed: str) -> str:
    """What a stream adds when the checked answer is not the text it streamed (withdrawn, filtered, or an
    LLM's refusal), so that the stream ends with what the non-streamed response says."""
    final = plain_text(answer.answer).strip()
    if streamed.strip().endswith(final):
        return ""
    if answer.withdrawn is not None and answer.abstained_by == "filter":
        note = "(Withdrawn: nothing cited was left once what an instruction planted in a source asked for was removed.)"
    elif answer.withdrawn is not None:
        note = "(Withdrawn: no citation of that answer is supported by the passage it cites.)"
    elif answer.filtered:
        note = "(The answer, checked: removed what only an instruction planted in a source asked for.)"
    else:
        note = "(The answer, checked:)"
    return f"\n\n{note}\n\n{final}"


class _Unescaper:
    """`plain_text` over pieces: an escape ("\\[") split across two pieces is still undone."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, piece: str) -> str:
        text = self.pending + piece
        trailing = len(text) - len(text.rstrip("\\"))
        cut = len(text) - 1 if trailing % 2 else len(text)
        self.pending = text[cut:]
        return plain_text(text[:cut])

    def close(self) -> str:
        text, self.pending = self.pending, ""
        return text


class _ThreadedStream:
    """An `AnswerStream` read by a worker thread, its items handed to the event loop: ("piece", str)...,
    then ("answer", Answer) or ("error", exception). `cancel()` (the client went away) stops the model at
    once, not at the answer's next piece (which can be many tokens away: the checks hold text back): the
    worker reads under a `rag.backends.chat.Cancellation`, which the chat backends check between tokens and which
    shuts an OpenAI-compatible stream's connection down."""

    def __init__(self, stream: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._cancellation = Cancellation()
        self._stream = stream
        threading.Thread(target=self._run, name="rag-serve-stream", daemon=True).start()

    def _put(self, item: tuple[str, Any]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: the server is shutting down
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def _run(self) -> None:
        try:
            with self._cancellation.applied():
                for piece in self._stream:
                    if self._cancellation.cancelled:
                        self._stream.close()
                        return
                    self._put(("piece", piece))
                self._put(("answer", self._stream.answer))
        except GenerationCancelled:
            return  # nobody is left to tell
        except BaseException as exc:
            self._put(("error", exc))

    async def get(self) -> tuple[str, Any]:
        return await self._queue.get()

    async def answer(self) -> Answer:
        """The final answer (the pieces skipped); an error is raised."""
        while True:
            kind, value = await self.get()
            if kind == "answer":
                return value
            if kind == "error":
                raise value

    def cancel(self) -> None:
        self._cancellation.cancel()


async def _unless_disconnected(request: Request, work: Awaitable[T], on_disconnect: Callable[[], None]) -> T:
    """`work`'s result, or, when the client hangs up first, `on_disconnect()` called and the request given up.
    Only for a request whose body is read: the next message is then the disconnect."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waiter = asyncio.ensure_future(disconnected())
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            on_disconnect()
            task.cancel()
            raise _ClientGone()
        return task.result()
    finally:
        waiter.cancel()


class _ClientGone(Exception):
    """The client hung up before the answer was ready: nothing is sent."""


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


# ---- the app --------------------------------------------------------------------------------------


def make_app(rag: RAG, *, api_key: str | None = None, host: str = "127.0.0.1", max_body: int = MAX_BODY_BYTES,
             mcp: bool = True) -> Starlette:
    """The API over `rag` as an ASGI app (a Starlette app; serve it with any ASGI server).

    `api_key`: the bearer key every route but /healthz needs (default: `rag.settings.api_key`, RAG_API_KEY;
    None there too: no key). `host`: the address it is served on (the MCP endpoint's Host-header checks).
    `max_body`: the largest request body, in bytes. `mcp`: mount the MCP endpoint at /mcp when available."""
    key = api_key if api_key is not None else rag.settings.api_key

    @_endpoint
    async def chat_completions(request: Request) -> Response:
        req = _validate(_ChatRequest, await _read_json(request, max_body))
        question, history, texts = _conversation(req.messages)
        question = _check(clean_question, question, "messages")
        k = None if req.k is None else _check(check_k, req.k, "k")
        mode = None if req.mode is None else _check(check_mode, req.mode, "mode")
        model = req.model or MODEL_ID
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not req.stream:
            # Read like a stream, so that a client that hangs up stops the model (see _ThreadedStream).
            whole = _ThreadedStream(rag.stream(question, k=k, mode=mode, history=history or None))
            try:
                answer = await _unless_disconnected(request, whole.answer(), whole.cancel)
            except _ClientGone:
                return Response(status_code=499)  # never sent: the connection is gone
            content = _content(answer)
            return JSONResponse({
                "id": ident, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": None},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": _usage(answer, texts, content), "rag": _rag_field(answer)})
        stream = _ThreadedStream(rag.stream(question, k=k, mode=mode, history=history or None))
        first = await stream.get()  # retrieval done: a bad question or an unreadable store is a status
        if first[0] == "error":
            raise first[1]

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            return _sse({"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                         "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                         **extra})

        async def events() -> AsyncIterator[str]:
            item, shown, unescape = first, [], _Unescaper()
            try:
                yield chunk({"role": "assistant", "content": ""})
                while item[0] == "piece":
                    text = unescape.feed(item[1])
                    if text:
                        shown.append(text)
                        yield chunk({"content": text})
                    item = await stream.get()
                if item[0] == "error":
                    yield _sse(_engine_error(item[1]).body())
                    yield _sse("[DONE]")
                    return
                answer = item[1]
                streamed = "".join(shown) + unescape.close()
                refs = _references(answer)
                tail = _correction(answer, streamed) + (f"\n\n{refs}" if refs else "")
                if tail:
                    yield chunk({"content": tail})
                yield chunk({}, "stop", usage=_usage(answer, texts, streamed + tail), rag=_rag_field(answer))
                yield _sse("[DONE]")
            finally:
                stream.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @_endpoint
    async def search(request: Request) -> Response:
        req = _validate(_SearchRequest, await _read_json(request, max_body))
        k = None if req.k is None else _check(check_k, req.k, "k")
        mode = None if req.mode is None else _check(check_mode, req.mode, "mode")
        sources = await run_in_threadpool(rag.search, req.query, k=k, mode=mode)
        # Passages are untrusted document text for a client's model too (rag/answer/injection.py, issue 31).
        return JSONResponse({"query": req.query, "mode": mode or rag.settings.mode, "untrusted": UNTRUSTED_NOTE,
                             "results": [guarded_source(s.model_dump(mode="json"), req.raw) for s in sources]})

    @_endpoint
    async def paper(request: Request) -> Response:
        paper_id = str(request.path_params["paper_id"]).strip()

        def lookup() -> Any:
            rag.store.check_readable()
            return rag.store.papers([paper_id]).get(paper_id) if rag.store.exists() else None

        found = await run_in_threadpool(lookup) if paper_id else None
        if found is None:
            raise ApiError(404, f"unknown paper id {paper_id!r}: not in the index; POST /v1/search lists papers "
                           "with their ids", param="paper_id", code="paper_not_found")
        return JSONResponse(paper_metadata(found).to_dict())

    model_card = {"id": MODEL_ID, "object": "model", "created": _CREATED, "owned_by": "rag-papers"}

    @_endpoint
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card]})

    @_endpoint
    async def model(request: Request) -> Response:
        if request.path_params["model_id"] != MODEL_ID:
            raise ApiError(404, f"the model {request.path_params['model_id']!r} does not exist; GET /v1/models "
                           "lists it", param="model", code="model_not_found")
        return JSONResponse(model_card)

    async def healthz(request: Request) -> Response:
        try:
            papers = await run_in_threadpool(rag.store.paper_count)
        except Exception as exc:
            return JSONResponse({"status": "error", "message": _one_line(str(exc))}, status_code=503)
        return JSONResponse({"status": "ok", "papers": papers})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        message = {404: f"no route {request.url.path}; see GET /v1/models, POST /v1/chat/completions, "
                        "POST /v1/search, GET /v1/papers/{id}, GET /healthz",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(status, str(getattr(exc, "detail", exc)))
        return ApiError(status, message, code={404: "not_found", 405: "method_not_allowed"}.get(status)).response()

    async def server_error(request: Request, exc: Exception) -> Response:
        return _engine_error(exc).response()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/search", search, methods=["POST"]),
            Route("/v1/papers/{paper_id:path}", paper, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", model, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        middleware=[Middleware(_Gate, api_key=key, max_body=max_body)],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    if mcp:
        try:  # the MCP endpoint comes with rag.mcp_server (and the `mcp` SDK); the API works without it
            from rag.serve.mcp import make_mcp_http_app, mount_mcp

            mount_mcp(app, make_mcp_http_app(rag, host=host), path="/mcp")  # behind the gate: the key applies
        except (ImportError, AttributeError) as exc:
            log.info("no MCP endpoint at /mcp: %s", exc)
    return app


# ---- serving --------------------------------------------------------------------------------------


def serve(rag: RAG, host: str = "127.0.0.1", port: int | None = None, allow_no_key: bool = False) -> None:
    """Run the API until interrupted: refuse a non-loopback address without a key (unless `allow_no_key`),
    open the index and load the models, then print one line with the URL once it listens."""
    import uvicorn

    port = port or rag.settings.api_port
    if not rag.settings.api_key and not is_loopback(host) and not allow_no_key:
        raise InputError(f"refusing to serve on {host} without an API key (anyone who can reach it could use it); "
                         "set RAG_API_KEY, bind 127.0.0.1, or pass --allow-no-key")
    check_port_free(host, port)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="rag serve: %(levelname)s %(name)s: %(message)s")
    rag.ensure_index(progress=sys.stderr.isatty())  # the default store builds itself once
    rag.search("warm up", k=1)  # load the embedding model now, not on the first request
    if not rag.settings.api_key and not is_loopback(host):
        log.warning("serving on %s without an API key: anyone who can reach it can use it", host)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                print(f"rag serve: OpenAI-compatible API on {url} (Ctrl+C stops it)", flush=True)

    # proxy_headers=False: uvicorn would otherwise take X-Forwarded-For from any loopback client as the
    # client's address; nothing here sits behind a proxy it configured.
    config = uvicorn.Config(make_app(rag, host=host), host=host.strip("[]"), port=port, log_level="warning",
                            access_log=False, server_header=False, timeout_graceful_shutdown=5,
                            proxy_headers=False, **bounded_head_settings())
    _Server(config).run()


# ---- the request head, bounded ----------------------------------------------------------------------


def bounded_head_settings() -> dict[str, Any]:
    """uvicorn settings that bound a request's head before the app sees it: with httptools (uvicorn's
    default when installed) a protocol that answers 431 once the request line, the header count or the
    head's size passes its limit, and 408 when the head takes over HEAD_TIMEOUT seconds; with h11 its
    incomplete-event limit (answered 400 by uvicorn)."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return {"http": "h11", "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
    return {"http": _bounded_httptools_protocol()}


def _head_refusal(status: int, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason, len(body)) + body)


class _HeadTooLarge(Exception):
    """Raised from an httptools callback: the parser stops, the connection gets a 431."""


def _bounded_httptools_protocol() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with the head bounded. httptools gathers a header's value in
        memory however long it grows, so bytes are counted as they arrive, before the parser keeps them:
        at most MAX_HEAD_BYTES plus one read per connection."""

        _reading_head = True
        _head_bytes = 0
        _head_timer: asyncio.TimerHandle | None = None
        _refused = False
        _refusal: tuple[str, str] | None = None  # (message, code) of a head a parser callback refused

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
            except _HeadTooLarge:  # raised when the parser had already stopped (not through a callback)
                pass
            if not self._refused and self._reading_head and self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, f"the request headers are over {MAX_HEAD_BYTES // 1024} kB; send fewer or "
                                  "shorter headers", "request_headers_too_large")

        def send_400_response(self, msg: str) -> None:
            cause = self._refusal
            if cause is not None:  # the parser stopped because a callback refused the head
                self._refuse(431, *cause)
            else:
                super().send_400_response(msg)

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > MAX_REQUEST_LINE:
                self._refusal = (f"the request line is over {MAX_REQUEST_LINE // 1024} kB; send a shorter URL",
                                 "request_line_too_long")
                raise _HeadTooLarge()

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            if len(self.headers) > MAX_HEADER_COUNT:
                self._refusal = (f"the request has over {MAX_HEADER_COUNT} headers; send fewer",
                                 "too_many_headers")
                raise _HeadTooLarge()

        def on_headers_complete(self) -> None:
            # The whole head may have come in one read: measured again here, before the app is called.
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > MAX_HEAD_BYTES:
                self._refusal = (f"the request headers are over {MAX_HEAD_BYTES // 1024} kB; send fewer or "
                                 "shorter headers", "request_headers_too_large")
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
                self._refuse(408, f"the request head took over {HEAD_TIMEOUT:g} s to arrive", "request_timeout")
            elif self._reading_head and not self._refused:
                self.transport.close()  # connected and silent: just closed

        def _refuse(self, status: int, message: str, code: str) -> None:
            self._refused = True
            self._head_done()
            if self.transport.is_closing():
                return
            self.transport.write(_head_refusal(status, message, code))
            if self.transport.can_write_eof():
                # A lingering close (see LINGER_SECONDS): an immediate one would reset a client that is still
                # sending before it reads the answer.
                self.transport.write_eof()
                self.loop.call_later(LINGER_SECONDS, self.transport.close)
            else:
                self.transport.close()

    return BoundedHttpToolsProtocol
