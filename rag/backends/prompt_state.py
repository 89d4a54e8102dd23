"""The local model's reading of its prompt's fixed start, kept on disk across processes.

Every prompt starts with the same turns (the system prompt and its worked example). llama.cpp reuses
what it has read within one process, but each `rag ask` is a new one, so the KV cache of those
tokens is saved once in `model_cache_dir/prompt-states/` and loaded by the next process. A file is
named by what it depends on (model file, llama-cpp-python's version, context size, tokens),
checksummed and written atomically; one that does not load is deleted and the tokens read again.
Not `llama_cpp.LlamaDiskCache`: it saved 329 MB a state (the logits too) against 10 MB here, took
1.2 s against 0.04 s to read and write it, and keys entries by tokens only.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from rag import prompts

KEEP = 4
_MAGIC = b"rag-kv1\n"
_SUFFIX = ".kv"


class PrefixStates:
    """Load or save the state of `llm`'s fixed prompt start before it reads a prompt (`restore`)."""

    def __init__(self, llm: Any, model_path: Path, directory: Path) -> None:
        import llama_cpp

        self._llm, self._dir = llm, directory
        stat = model_path.stat()
        self._identity = (
            f"{model_path.name}|{stat.st_size}|{stat.st_mtime_ns}|{llama_cpp.__version__}|"
            f"{llm.n_ctx()}"
        )
        self._prefixes: dict[int, tuple[list[int], Path]] = {}

    def restore(self, messages: list[dict]) -> None:
        """Before `messages` are read: unless the model's cache already holds their fixed start,
        load it from disk, or read it alone and save it (the read is not extra: the prompt reuses
        it)."""
        found = self._prefix(messages)
        if found is None:
            return
        prefix, path = found
        llm = self._llm
        if llm.n_tokens >= len(prefix) and llm.input_ids[: len(prefix)].tolist() == prefix:
            return
        if self._load(path, prefix):
            return
        llm.reset()
        llm.eval(prefix)
        self._save(path)

    def _prefix(self, messages: list[dict]) -> tuple[list[int], Path] | None:
        n = prompts.fixed_start(messages)
        if n == 0 or n == len(messages) or "tokenizer.chat_template" not in self._llm.metadata:
            return None
        key = hash(tuple((m["role"], m["content"]) for m in messages[:n]))
        if key not in self._prefixes:
            fixed = messages[:n]
            a, b = (
                self._tokens([*fixed, {"role": "user", "content": text}])
                for text in ("alpha", "beta")
            )
            shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            digest = hashlib.sha256(f"{self._identity}|{a[:shared]}".encode()).hexdigest()[:32]
            self._prefixes[key] = (a[:shared], self._dir / f"{digest}{_SUFFIX}")
        return self._prefixes[key]

    def _tokens(self, messages: list[dict]) -> list[int]:
        """The prompt's tokens as llama-cpp-python's chat handler makes them from the model's own
        template."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llm = self._llm
        bos = llm._model.token_get_text(llm.token_bos()) if llm.token_bos() >= 0 else ""
        formatter = Jinja2ChatFormatter(
            template=llm.metadata["tokenizer.chat_template"],
            eos_token=llm._model.token_get_text(llm.token_eos()),
            bos_token=bos,
        )
        result = formatter(messages=messages)
        return list(
            llm.tokenize(result.prompt.encode(), add_bos=not result.added_special, special=True)
        )

    def _load(self, path: Path, prefix: list[int]) -> bool:
        import llama_cpp

        try:
            data = path.read_bytes()
        except OSError:
            return False
        payload = data[len(_MAGIC) + 32 :]
        if (
            not data.startswith(_MAGIC)
            or hashlib.sha256(payload).digest() != data[len(_MAGIC) : len(_MAGIC) + 32]
        ):
            _remove(path)
            return False
        llm = self._llm
        state = (ctypes.c_uint8 * len(payload)).from_buffer_copy(payload)
        if llama_cpp.llama_state_set_data(llm._ctx.ctx, state, len(payload)) != len(payload):
            llm.reset()
            _remove(path)
            return False
        llm.input_ids[: len(prefix)] = prefix
        llm.n_tokens = len(prefix)
        # its logits were not computed in this process: the next token is decoded
        llm._requires_eval = True
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: kept by `_prune`
        return True

    def _save(self, path: Path) -> None:
        import llama_cpp

        ctx = self._llm._ctx.ctx
        size = llama_cpp.llama_state_get_size(ctx)
        state = (ctypes.c_uint8 * int(size))()
        written = int(llama_cpp.llama_state_get_data(ctx, state, size))
        payload = bytes(state)[:written]
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self._dir, suffix=".tmp")
        except OSError:
            # a read-only cache directory: each process reads the instructions itself, as before
            return
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)
        except OSError:
            _remove(Path(tmp))
            return
        self._prune()

    def _prune(self) -> None:
        def used(path: Path) -> float:
            try:
                return path.stat().st_mtime
            except OSError:  # removed by another process meanwhile
                return 0.0

        for old in sorted(self._dir.glob(f"*{_SUFFIX}"), key=used, reverse=True)[KEEP:]:
            _remove(old)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
