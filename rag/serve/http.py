"""`rag serve`: the engine as an OpenAI-compatible HTTP API (Starlette, served by uvicorn), so that
any OpenAI client gets cited answers (routes, errors and limits: docs/http-api.md).

`make_app(rag)` builds the ASGI app; `serve(rag, host, port)` checks the binding, opens the index
and runs it. Here: the routes, and the thread that feeds a stream to the event loop (engine calls
block, so they run in worker threads). The key, limits and error mapping are `rag.serve.gate`, the
OpenAI shapes `rag.serve.openai_shapes`, the argument checks shared with MCP `rag.serve.requests`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rag import UNTRUSTED_NOTE, Cancellation, GenerationCancelled
from rag.errors import InputError, StoreError
from rag.metadata import paper_metadata
from rag.net import check_port_free, is_loopback
from rag.serve import openai_shapes as shapes
from rag.serve.gate import (
    MESSAGE_LIMIT,
    ApiError,
    Gate,
    bounded_head_settings,
    endpoint,
    engine_error,
    read_json,
    validate,
)
from rag.serve.requests import checked, one_line, retrieval_options

if TYPE_CHECKING:
    from rag import RAG
    from rag.models import Answer

__all__ = ["MAX_BODY_BYTES", "MODEL_ID", "make_app", "serve"]

T = TypeVar("T")

log = logging.getLogger(__name__)

MODEL_ID = "rag"
# a question is at most 2,000 characters; a long chat history fits easily
MAX_BODY_BYTES = 64 * 1024
_CREATED = int(time.time())


# ---- the answer, read in a worker thread
# ------------------------------------------------------------


class _ThreadedStream:
    """An `AnswerStream` read by a worker thread, its items handed to the event loop: ("piece",
    str)..., then ("answer", Answer) or ("error", exception). `cancel()` (the client went away)
    stops the model at once, not at the answer's next piece (which can be many tokens away: the
    checks hold text back): the worker reads under a `rag.Cancellation`, which the chat backends
    check between tokens and which shuts an OpenAI-compatible stream's connection down."""

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


async def _unless_disconnected(
    request: Request, work: Awaitable[T], on_disconnect: Callable[[], None]
) -> T:
    """`work`'s result, or, when the client hangs up first, `on_disconnect()` called and the request
    given up. Only for a request whose body is read: the next message is then the disconnect."""

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


# ---- the app
# --------------------------------------------------------------------------------------


def make_app(
    rag: RAG,
    *,
    api_key: str | None = None,
    host: str = "127.0.0.1",
    max_body: int = MAX_BODY_BYTES,
    mcp: bool = True,
) -> Starlette:
    """The API over `rag` as an ASGI app (a Starlette app; serve it with any ASGI server).

    `api_key`: the bearer key every route but /healthz needs (default: `rag.settings.api_key`,
    RAG_API_KEY; None there too: no key). `host`: the address it is served on (the MCP endpoint's
    Host-header checks). `max_body`: the largest request body, in bytes. `mcp`: mount the MCP
    endpoint at /mcp when available."""
    key = api_key if api_key is not None else rag.settings.api_key

    @endpoint
    async def chat_completions(request: Request) -> Response:
        req = validate(shapes.ChatRequest, await read_json(request, max_body))
        question, history, texts = shapes.conversation(req.messages)
        question = checked(rag.check_question, question, "messages")
        k, mode = retrieval_options(req.k, req.mode)
        model = req.model or MODEL_ID
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if not req.stream:
            # Read like a stream, so that a client that hangs up stops the model (see
            # _ThreadedStream).
            whole = _ThreadedStream(rag.stream(question, k=k, mode=mode, history=history or None))
            try:
                answer = await _unless_disconnected(request, whole.answer(), whole.cancel)
            except _ClientGone:
                return Response(status_code=499)  # never sent: the connection is gone
            content = shapes.content(answer)
            return JSONResponse(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content, "refusal": None},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": shapes.usage(answer, texts, content),
                    "rag": shapes.rag_field(answer),
                }
            )
        stream = _ThreadedStream(rag.stream(question, k=k, mode=mode, history=history or None))
        # retrieval done: a bad question or an unreadable store is a status
        first = await stream.get()
        if first[0] == "error":
            raise first[1]

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            return shapes.sse(
                {
                    "id": ident,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [
                        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                    ],
                    **extra,
                }
            )

        async def events() -> AsyncIterator[str]:
            item, shown, unescape = first, [], shapes.Unescaper()
            try:
                yield chunk({"role": "assistant", "content": ""})
                while item[0] == "piece":
                    text = unescape.feed(item[1])
                    if text:
                        shown.append(text)
                        yield chunk({"content": text})
                    item = await stream.get()
                if item[0] == "error":
                    yield shapes.sse(engine_error(item[1]).body())
                    yield shapes.sse("[DONE]")
                    return
                answer = item[1]
                streamed = "".join(shown) + unescape.close()
                refs = shapes.references(answer)
                tail = f"\n\n{refs}" if refs else ""  # the stream is the answer: nothing to correct
                if tail:
                    yield chunk({"content": tail})
                yield chunk(
                    {},
                    "stop",
                    usage=shapes.usage(answer, texts, streamed + tail),
                    rag=shapes.rag_field(answer),
                )
                yield shapes.sse("[DONE]")
            finally:
                stream.cancel()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @endpoint
    async def search(request: Request) -> Response:
        req = validate(shapes.SearchRequest, await read_json(request, max_body))
        k, mode = retrieval_options(req.k, req.mode)
        sources = await run_in_threadpool(rag.search, req.query, k=k, mode=mode)
        results, sentences = await run_in_threadpool(rag.guarded, sources, req.raw)
        # Passages are untrusted document text for a client's model too (rag/answer/injection.py).
        return JSONResponse(
            {
                "query": req.query,
                "mode": mode or rag.settings.mode,
                "untrusted": UNTRUSTED_NOTE,
                "results": results,
                "sentences": sentences,
            }
        )

    @endpoint
    async def paper(request: Request) -> Response:
        paper_id = str(request.path_params["paper_id"]).strip()

        def lookup() -> Any:
            rag.store.check_readable()
            return rag.store.papers([paper_id]).get(paper_id) if rag.store.exists() else None

        found = await run_in_threadpool(lookup) if paper_id else None
        if found is None:
            raise ApiError(
                404,
                f"unknown paper id {paper_id!r}: not in the index; POST /v1/search lists papers "
                "with their ids",
                param="paper_id",
                code="paper_not_found",
            )
        return JSONResponse(paper_metadata(found).to_dict())

    model_card = {"id": MODEL_ID, "object": "model", "created": _CREATED, "owned_by": "rag-papers"}

    @endpoint
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [model_card]})

    @endpoint
    async def model(request: Request) -> Response:
        if request.path_params["model_id"] != MODEL_ID:
            raise ApiError(
                404,
                f"the model {request.path_params['model_id']!r} does not exist; GET /v1/models "
                "lists it",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(model_card)

    async def healthz(request: Request) -> Response:
        try:  # a replica's caches are first brought level with the corpus on the server
            papers, not_ready = await run_in_threadpool(rag.readiness)
        except Exception as exc:
            return JSONResponse(
                {"status": "error", "message": one_line(str(exc), MESSAGE_LIMIT)}, status_code=503
            )
        if not_ready:  # a replica started before any paper was on the server: not ready yet
            return JSONResponse(
                {"status": "error", "papers": 0, "message": not_ready}, status_code=503
            )
        return JSONResponse({"status": "ok", "papers": papers})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        message = {
            404: f"no route {request.url.path}; see GET /v1/models, POST /v1/chat/completions, "
            "POST /v1/search, GET /v1/papers/{id}, GET /healthz",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(status, str(getattr(exc, "detail", exc)))
        return ApiError(
            status, message, code={404: "not_found", 405: "method_not_allowed"}.get(status)
        ).response()

    async def server_error(request: Request, exc: Exception) -> Response:
        return engine_error(exc).response()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/search", search, methods=["POST"]),
            Route("/v1/papers/{paper_id:path}", paper, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", model, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        middleware=[Middleware(Gate, api_key=key, max_body=max_body)],
        exception_handlers={HTTPException: http_error, Exception: server_error},
    )
    if mcp:
        # the MCP endpoint comes with rag.serve.mcp (and the `mcp` SDK); the API works without it
        try:
            from rag.serve.mcp import make_mcp_http_app, mount_mcp

            # behind the gate: the key applies
            mount_mcp(app, make_mcp_http_app(rag, host=host), path="/mcp")
        except (ImportError, AttributeError) as exc:
            log.info("no MCP endpoint at /mcp: %s", exc)
    return app


# ---- serving
# --------------------------------------------------------------------------------------


def serve(
    rag: RAG, host: str = "127.0.0.1", port: int | None = None, allow_no_key: bool = False
) -> None:
    """Run the API until interrupted: refuse a non-loopback address without a key (unless
    `allow_no_key`), open the index and load the models, then print one line with the URL once it
    listens."""
    import uvicorn

    port = port or rag.settings.api_port
    if not rag.settings.api_key and not is_loopback(host) and not allow_no_key:
        raise InputError(
            f"refusing to serve on {host} without an API key (anyone who can reach it could use"
            " it); set RAG_API_KEY, bind 127.0.0.1, or pass --allow-no-key"
        )
    check_port_free(host, port)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="rag serve: %(levelname)s %(name)s: %(message)s",
    )
    try:
        rag.ensure_index(progress=sys.stderr.isatty())  # the default store builds itself once
        # load the embedding model and the indexes now, not on the first request
        rag.search("warm up", k=1)
    except StoreError as exc:
        # A replica of a new deployment may start before any paper is on the server: it serves
        # (/healthz answers 503, questions a one-line error) and catches up on the first request
        # after an ingest.
        if (
            not rag.settings.chroma_url
            or rag.store.exists()
            or (rag.store.server_state() or ("", 0))[1]
        ):
            raise
        log.warning("%s", exc)  # no paper on the server yet (Store.check_readable)
        rag.embedder.embed_query("warm up")
    if not rag.settings.api_key and not is_loopback(host):
        log.warning("serving on %s without an API key: anyone who can reach it can use it", host)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1"

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                print(f"rag serve: OpenAI-compatible API on {url} (Ctrl+C stops it)", flush=True)

    # proxy_headers=False: uvicorn would otherwise take X-Forwarded-For from any loopback client as
    # the client's address; nothing here sits behind a proxy it configured.
    config = uvicorn.Config(
        make_app(rag, host=host),
        host=host.strip("[]"),
        port=port,
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=5,
        proxy_headers=False,
        **bounded_head_settings(),
    )
    _Server(config).run()
