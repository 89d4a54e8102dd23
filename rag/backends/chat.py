"""Chat backends: what answering uses of one (`ChatModel`), OpenAI or any OpenAI-compatible server
(`OpenAIChat`), a GGUF run in-process by llama-cpp-python (`LocalChat`), and `make_llm`, which picks
one from the settings. Also the one-line descriptions of failed calls (`describe_llm_failure`), the
yes/no share the answerability check and the reranker read (`yes_share`), and OpenAI's price table
(`estimate_cost`).

The `openai` client, llama-cpp-python and numpy are imported only when a backend is made or used.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rag.backends.cpu_share import CpuSample, writing_threads
from rag.backends.modelfiles import LOCAL_INSTALL_HINT, qwen_gguf
from rag.config import Settings, redact_url
from rag.errors import LLMError

if TYPE_CHECKING:
    from rag.models import Usage

# A chat message as the OpenAI API takes it: {"role": "system" | "user" | "assistant", "content":
# "..."}.
Message = dict[str, str]


@runtime_checkable
class ChatModel(Protocol):
    """What answering, the answerability check, `rag doctor` and the benches use of a chat
    backend."""

    @property
    def label(self) -> str:
        """The model and where it runs, for people (an endpoint's URL without its secrets)."""
        ...

    def check_model(self) -> None:
        """Raise LLMError, naming the setting to fix, when the model cannot be served."""
        ...

    def stream(self, messages: list[Message]) -> Iterator[str | Usage]:
        """The answer's text pieces as they come, then a `Usage` when the backend reports one."""
        ...

    def complete(self, messages: list[Message]) -> str:
        """A short reply (96 tokens at most, temperature 0), whole."""
        ...

    def yes_probability(self, messages: list[Message]) -> float:
        """The share of yes among yes/no for the next token (see `yes_share`)."""
        ...

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """Estimated USD for a call of these sizes; None when not known."""
        ...


# USD per million tokens (input, output) for OpenAI models, to estimate a call's cost.
OPENAI_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-3.5-turbo": (0.50, 1.50),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
}
OPENAI_URL = "https://api.openai.com/v1"


def estimate_cost(
    model: str, base_url: str | None, prompt_tokens: int, completion_tokens: int
) -> float | None:
    """Estimated USD for a call to a known OpenAI model; None elsewhere (local servers, unknown
    models)."""
    if base_url and "api.openai.com" not in base_url:
        return None
    price = OPENAI_PRICES.get(model) or next(
        (
            p
            for name, p in sorted(OPENAI_PRICES.items(), key=lambda kv: -len(kv[0]))
            if model.startswith(name + "-")
        ),
        None,
    )
    if price is None:
        return None
    return round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 6)


class StreamBroke(Exception):
    """The endpoint ended a streamed answer before it was finished."""


# ---- cancellation: a reader that went away stops the model --------------------------------------


class GenerationCancelled(Exception):
    """The reader of an answer went away (a dropped HTTP stream, a closed chat tab, a cancelled
    tool call) and the model was stopped. Raised by a backend's calls once the `Cancellation`
    they run under is set; not an `LLMError`, so an answer does not fall back to quoting: it
    ends."""


class Cancellation:
    """A flag set from any thread that stops the chat backends working for one answer.

    `with cancellation.applied():` makes it the current one in this thread (the thread that reads
    the answer: the backends run inside its `next()` calls). Set, it stops generation at once:
    the backends check it between tokens (and llama.cpp between prompt batches), and an
    OpenAI-compatible stream's connection is shut down from the cancelling thread, so a read that
    waits for the next token ends too and the server sees the client leave. The backends' calls
    then raise `GenerationCancelled`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        """Stop the answer (idempotent, any thread)."""
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            closers, self._closers = self._closers, []
        for close in closers:
            with contextlib.suppress(Exception):  # a connection already gone: nothing left to stop
                close()

    def check(self) -> None:
        if self._event.is_set():
            raise GenerationCancelled("the reader went away; generation stopped")

    @contextlib.contextmanager
    def on_cancel(self, close: Callable[[], None]) -> Iterator[None]:
        """Run `close` (from the cancelling thread) if the answer is cancelled while inside the
        block."""
        with self._lock:
            registered = not self._event.is_set()
            if registered:
                self._closers.append(close)
        if not registered:
            close()
        try:
            yield
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._closers.remove(close)

    @contextlib.contextmanager
    def applied(self) -> Iterator[Cancellation]:
        """Make this the current cancellation of the calling thread inside the block."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


_NEVER = Cancellation()  # the current one when nobody can cancel: never set
_CURRENT: contextvars.ContextVar[Cancellation] = contextvars.ContextVar(
    "rag_cancellation", default=_NEVER
)


def current_cancellation() -> Cancellation:
    """The `Cancellation` the calling thread answers under (one that is never set by default)."""
    return _CURRENT.get()


def read_in_thread(stream: Any, tick: float = 0.25) -> Iterator[str | None]:
    """The pieces of `stream` (an `AnswerStream`), read by a worker thread under a fresh
    `Cancellation`, and None whenever `tick` seconds pass without one: a caller that is a
    generator driven by someone else (a Gradio event) stays at a yield often enough to be closed
    when its reader leaves, even while the model writes text the answer's checks hold back.
    Closing this generator cancels the answer: the model stops. After the last piece,
    `stream.answer` holds the answer; an error of the stream is raised here."""
    import queue

    items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    cancellation = Cancellation()

    def run() -> None:
        try:
            with cancellation.applied():
                for piece in stream:
                    if cancellation.cancelled:
                        stream.close()
                        return
                    items.put(("piece", piece))
            items.put(("done", None))
        except GenerationCancelled:
            items.put(("done", None))
        except BaseException as exc:
            items.put(("error", exc))

    threading.Thread(target=run, name="rag-answer-reader", daemon=True).start()
    try:
        while True:
            try:
                kind, value = items.get(timeout=tick)
            except queue.Empty:
                yield None
                continue
            if kind == "piece":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        cancellation.cancel()  # a no-op once the answer is complete


def _shutdown_connection(response: Any) -> None:
    """Shut down the socket under an httpx response: a thread blocked reading it wakes at once
    (closing the socket would not wake it), and the server sees the client leave."""
    stream = (getattr(response, "extensions", None) or {}).get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)


def describe_llm_failure(exc: BaseException, settings: Settings) -> str:
    """One line naming the cause and the setting to check. Never contains the API key."""
    import openai

    where = redact_url(settings.openai_base_url or OPENAI_URL)
    status = getattr(exc, "status_code", None)
    retries = settings.llm_retries
    if isinstance(exc, StreamBroke):
        text = (
            f"the answer stream from {where} broke off ({exc}); check the server at OPENAI_BASE_URL"
        )
    elif isinstance(exc, openai.AuthenticationError):
        text = f"the LLM endpoint {where} rejected the API key (401); check OPENAI_API_KEY"
    elif isinstance(exc, openai.PermissionDeniedError):
        text = (
            f"the LLM endpoint {where} refused access (403); check OPENAI_API_KEY and RAG_LLM_MODEL"
        )
    elif isinstance(exc, openai.NotFoundError):
        text = (
            f"the LLM endpoint {where} answered 404 for model {settings.llm_model!r}; check"
            " RAG_LLM_MODEL and OPENAI_BASE_URL"
        )
    elif isinstance(exc, openai.RateLimitError):
        text = (
            f"the LLM endpoint {where} is rate limiting (429) after {retries} retries; wait and"
            " retry, or raise RAG_LLM_RETRIES"
        )
    elif isinstance(exc, openai.InternalServerError):
        text = (
            f"the LLM endpoint {where} had a server error ({status}) after {retries} retries; check"
            " the server at OPENAI_BASE_URL"
        )
    elif isinstance(exc, openai.APITimeoutError):
        text = (
            f"the LLM endpoint {where} timed out after {settings.llm_timeout:g} s; raise"
            " RAG_LLM_TIMEOUT or check OPENAI_BASE_URL"
        )
    elif isinstance(exc, openai.APIConnectionError):
        text = (
            f"cannot connect to the LLM endpoint {where}; is the server running? check"
            " OPENAI_BASE_URL"
        )
    elif isinstance(exc, openai.BadRequestError):
        text = (
            f"the LLM endpoint {where} rejected the request (400); check RAG_LLM_MODEL and"
            " RAG_LLM_CONTEXT_TOKENS"
        )
    elif isinstance(exc, openai.APIStatusError):
        text = (
            f"the LLM endpoint {where} answered {status}; check OPENAI_BASE_URL and RAG_LLM_MODEL"
        )
    else:
        text = (
            f"the LLM call to {where} failed ({type(exc).__name__}); check OPENAI_BASE_URL and"
            " RAG_LLM_MODEL"
        )
    key = settings.openai_api_key
    return text.replace(key, "***") if key else text


def yes_share(top_logprobs: list[tuple[str, float]], text: str) -> float:
    """P(yes) / (P(yes) + P(no)) from one token's top log-probabilities; the greedy token's word
    when neither is among them (an endpoint without log-probabilities)."""
    yes = sum(math.exp(lp) for tok, lp in top_logprobs if tok.strip().lower() == "yes")
    no = sum(math.exp(lp) for tok, lp in top_logprobs if tok.strip().lower() == "no")
    if yes + no > 0:
        return yes / (yes + no)
    return 0.0 if text.strip().lower().startswith("no") else 1.0


class OpenAIChat:
    """Chat completions from OpenAI or any OpenAI-compatible server, streamed.

    Retries (429, 5xx, connection errors) are the openai client's: bounded by RAG_LLM_RETRIES,
    with exponential backoff that honours Retry-After.
    """

    def __init__(self, settings: Settings) -> None:
        import openai

        self.settings = settings
        self.model = settings.llm_model
        self.base_url = settings.openai_base_url or OPENAI_URL
        # Any: messages are plain dicts here, not the client's TypedDicts.
        self._client: Any = openai.OpenAI(
            base_url=self.base_url,
            api_key=settings.openai_api_key or "not-needed",
            timeout=settings.llm_timeout,
            max_retries=settings.llm_retries,
        )
        self._model_checked = False
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"{self.model} at {redact_url(self.base_url)}"

    def check_model(self) -> None:
        """Servers such as llama.cpp's answer any model name with their own: ask /models first."""
        with self._lock:
            if self._model_checked:
                return
            import openai

            try:
                served = [m.id for m in self._client.models.list()]
            except openai.NotFoundError:
                served = []  # no /models on this server: nothing to check against
            except Exception as exc:
                raise LLMError(describe_llm_failure(exc, self.settings)) from None
            if served and self.model not in served:
                raise LLMError(
                    f"model {self.model!r} is not served at {redact_url(self.base_url)} (available:"
                    f" {', '.join(served[:8])}); check RAG_LLM_MODEL"
                )
            self._model_checked = True

    def stream(self, messages: list[Message]) -> Iterator[str | Usage]:
        """Yield text pieces, then a `Usage` when the server reports one."""
        from rag.models import Usage

        cancel = current_cancellation()
        cancel.check()
        self.check_model()
        finished = False
        received = 0
        stream = None
        try:
            stream = self._client.chat.completions.create(
                model=self.model,
                messages=messages,
                stream=True,
                temperature=self.settings.llm_temperature,
                max_tokens=self.settings.llm_max_tokens,
                stream_options={"include_usage": True},
            )
            with cancel.on_cancel(lambda: _shutdown_connection(stream.response)):
                for chunk in stream:
                    cancel.check()
                    if chunk.usage:
                        yield Usage(
                            prompt_tokens=chunk.usage.prompt_tokens or 0,
                            completion_tokens=chunk.usage.completion_tokens or 0,
                            total_tokens=chunk.usage.total_tokens or 0,
                        )
                    for choice in chunk.choices or []:
                        if choice.delta and choice.delta.content:
                            received += len(choice.delta.content)
                            yield choice.delta.content
                        if choice.finish_reason:
                            finished = True
        except (LLMError, GenerationCancelled):
            raise
        except Exception as exc:
            cancel.check()  # the read failed because the connection was shut down on purpose
            if received and not isinstance(exc, StreamBroke):
                exc = StreamBroke(f"after {received} characters: {type(exc).__name__}")
            raise LLMError(describe_llm_failure(exc, self.settings)) from None
        finally:
            # Closed here, not left to the garbage collector: the connection would otherwise stay
            # checked out of the pool, open, while the server generates the rest of an answer nobody
            # reads.
            if stream is not None:
                stream.close()
        if not finished:
            raise LLMError(
                describe_llm_failure(
                    StreamBroke(f"no end of answer after {received} characters"), self.settings
                )
            )

    def complete(self, messages: list[Message]) -> str:
        current_cancellation().check()
        self.check_model()
        try:
            reply = self._client.chat.completions.create(
                model=self.model, messages=messages, temperature=0.0, max_tokens=96
            )
        except Exception as exc:
            raise LLMError(describe_llm_failure(exc, self.settings)) from None
        return (reply.choices[0].message.content or "") if reply.choices else ""

    def yes_probability(self, messages: list[Message]) -> float:
        """The share of yes among yes/no for the next token (see `yes_share`)."""
        import openai

        current_cancellation().check()
        self.check_model()
        request = dict(model=self.model, messages=messages, temperature=0.0, max_tokens=1)
        try:
            try:
                reply = self._client.chat.completions.create(
                    **request, logprobs=True, top_logprobs=10
                )
            except openai.BadRequestError:  # an endpoint without log-probabilities: its greedy word
                reply = self._client.chat.completions.create(**request)
        except Exception as exc:
            raise LLMError(describe_llm_failure(exc, self.settings)) from None
        choice = reply.choices[0] if reply.choices else None
        tokens = (choice.logprobs.content or []) if choice and choice.logprobs else []
        top = [(t.token, t.logprob) for t in tokens[0].top_logprobs] if tokens else []
        return yes_share(top, (choice.message.content or "") if choice else "")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return estimate_cost(
            self.model, self.settings.openai_base_url, prompt_tokens, completion_tokens
        )


class LocalChat:
    """A GGUF chat model run in-process by llama-cpp-python (`RAG_LLM=local`):
    Qwen2.5-Coder-1.5B-Instruct (the `[local]` extra) unless RAG_LOCAL_MODEL_PATH names another
    file.

    llama.cpp keeps the previous prompt's tokens in its cache and reuses the longest common prefix,
    so the fixed system prompt is read once per process, not once per question.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            import llama_cpp
        except ImportError:
            raise LLMError(f"RAG_LLM=local needs llama-cpp-python: {LOCAL_INSTALL_HINT}") from None
        if settings.local_model_path is not None:
            path = Path(settings.local_model_path)
            if not path.is_file():
                raise LLMError(
                    f"no local model file at {path}; set RAG_LOCAL_MODEL_PATH to a .gguf file, or "
                    "unset it for the bundled Qwen2.5-Coder-1.5B-Instruct"
                )
        else:
            path = qwen_gguf(settings.model_cache_dir)
        self.model = path.name
        threads = settings.llm_threads or os.cpu_count() or 1
        self._threads = threads
        try:
            # Any: messages are plain dicts here, and replies are read as dicts, not llama_cpp's
            # TypedDicts.
            self._llm: Any = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=settings.llm_context_tokens + settings.llm_max_tokens + 512,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=512,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise LLMError(
                f"llama.cpp cannot load {path} ({exc}); check RAG_LOCAL_MODEL_PATH"
            ) from None
        self._lock = threading.Lock()  # one generation at a time per in-process model
        self.writing_threads = threads  # the last answer's (rag/backends/cpu_share.py)
        _stop_decoding_when_cancelled(self._llm)
        self._prefix_states = None
        if settings.llm_prompt_cache:
            from rag.backends.prompt_state import PrefixStates

            self._prefix_states = PrefixStates(
                self._llm, path, settings.model_cache_dir / "prompt-states"
            )

    def _start(self, messages: list[Message]) -> None:
        """Before reading `messages` (the lock held): their fixed start from disk when this
        process has not read it (rag/backends/prompt_state.py)."""
        if self._prefix_states is not None:
            self._prefix_states.restore(messages)

    @property
    def label(self) -> str:
        return f"{self.model} (local, llama-cpp-python)"

    def check_model(self) -> None:
        return None

    def stream(self, messages: list[Message]) -> Iterator[str]:
        """Yield text pieces (llama-cpp-python reports no usage). A cancelled answer stops before
        the next token (or prompt batch) is computed."""
        cancel = current_cancellation()
        cancel.check()
        with self._lock:
            cancel.check()  # it may have been cancelled while another answer held the model
            self._start(messages)
            reading = CpuSample.now()
            chunks = self._llm.create_chat_completion(
                messages=messages,
                stream=True,
                temperature=self.settings.llm_temperature,
                max_tokens=self.settings.llm_max_tokens,
            )
            try:
                for i, chunk in enumerate(chunks):
                    cancel.check()
                    if i == 0:  # the prompt is read: the rest is writing
                        self._write_with(reading)
                    delta = chunk["choices"][0].get("delta", {}).get("content")
                    if delta:
                        yield delta
            finally:
                chunks.close()  # llama.cpp stops here, not when the garbage collector gets to it

    def _write_with(self, reading: CpuSample) -> None:
        """Set the threads that write this answer: RAG_LLM_WRITING_THREADS, or the cores that
        other processes left free while the model read (rag/backends/cpu_share.py). The reading
        keeps every thread."""
        import llama_cpp

        write = self.settings.llm_writing_threads or writing_threads(
            reading.others_cores(CpuSample.now()), self._threads
        )
        write = min(write, self._threads)
        if write != self.writing_threads:
            llama_cpp.llama_set_n_threads(self._llm.ctx, write, self._threads)
            self.writing_threads = write

    def complete(self, messages: list[Message]) -> str:
        current_cancellation().check()
        with self._lock:
            self._start(messages)
            reply = self._llm.create_chat_completion(
                messages=messages, temperature=0.0, max_tokens=96
            )
        return reply["choices"][0]["message"].get("content") or ""

    def yes_probability(self, messages: list[Message]) -> float:
        """The share of yes among yes/no for the next token, read from the logits llama.cpp keeps
        for the prompt's last position. (llama-cpp-python's own log-probabilities need
        `logits_all`, which computes and copies the whole vocabulary's logits for every prompt
        token: seconds per question on a CPU.)"""
        import numpy as np

        current_cancellation().check()
        with self._lock:
            self._start(messages)
            reply = self._llm.create_chat_completion(
                messages=messages, temperature=0.0, max_tokens=1
            )
            try:
                logits = np.ctypeslib.as_array(
                    self._llm._ctx.get_logits(), shape=(self._llm.n_vocab(),)
                ).copy()
            except Exception:  # another llama-cpp-python: its greedy word
                return yes_share([], reply["choices"][0]["message"].get("content") or "")
        words = {
            word: [
                t
                for t in (
                    self._single_token(v)
                    for v in (word, word.capitalize(), " " + word, " " + word.capitalize())
                )
                if t is not None
            ]
            for word in ("yes", "no")
        }
        top = [(word, float(logits[t])) for word, ids in words.items() for t in ids]
        peak = max(lp for _, lp in top)
        return yes_share([(w, lp - peak) for w, lp in top], "")

    def _single_token(self, text: str) -> int | None:
        ids = self._llm.tokenize(text.encode(), add_bos=False, special=False)
        return ids[0] if len(ids) == 1 else None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return 0.0


def _stop_decoding_when_cancelled(llm: Any) -> None:
    """Check the reader's `Cancellation` before each llama.cpp decode: every generated token, and
    every `n_batch` tokens of the prompt, which can take seconds to read on a CPU. Raised before
    the decode, the cache and llama-cpp-python's token count stay consistent (the next prompt
    reuses what was read)."""
    ctx: Any = getattr(llm, "_ctx", None)
    decode = getattr(ctx, "decode", None)
    if decode is None:  # another llama-cpp-python: tokens are still checked in `stream`
        return

    def checked_decode(batch: Any) -> Any:
        current_cancellation().check()
        return decode(batch)

    ctx.decode = checked_decode


def make_llm(settings: Settings) -> ChatModel | None:
    """The chat backend for the configured LLM, or None when answers are extractive."""
    backend = settings.llm_backend
    if backend == "none":
        return None
    if backend == "local":
        return LocalChat(settings)
    return OpenAIChat(settings)
