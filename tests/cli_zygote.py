"""`rag` commands as forks of a process that has already imported the stack: what `run_cli` runs.

A `rag` process spends most of a short command starting Python and importing chromadb, onnxruntime,
numpy and the project (~2 s of a ~3 s `rag search` on the CI machine). The zygote, one per test
process, imports them once and then forks a child per command; the child sets the command's
environment and working directory, points fd 0 at /dev/null and fd 1 and 2 at files of its own, and
runs `rag.cli.main`, which is all the `rag` executable runs. Nothing else is shared: no model, no
Chroma client and no thread exists before the fork (the zygote checks it is single-threaded, since a
fork copies only the calling thread), so the child loads its model and opens the store as a fresh
process does. An exception that escapes `main` is a traceback on stderr and exit 1, as in a process
of its own; a child past its timeout is killed (SIGKILL) and its result says so.

Tests of a cold start itself (imports, start-up time, signals to the `rag` process) use
`run_cli(..., cold=True)`: the installed `rag` executable in a new process.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading

_ZYGOTE = r"""
import json, os, signal, sys, tempfile, threading, time, traceback, warnings
sys.argv[0] = "rag"  # argparse's prog, as in the `rag` executable
import numpy, onnxruntime, tokenizers, chromadb, pydantic_settings  # the slow imports, once
import rag.cli, rag.engine, rag.index.store, rag.index.vectors, rag.index.keyword, rag.index.ingest
import rag.retrieve.search, rag.answer.respond, rag.backends.embedders
if threading.active_count() != 1:
    raise SystemExit(f"zygote: {threading.active_count()} threads after the imports; "
                     "a fork would lose them")
requests, replies = sys.stdin.buffer, sys.stdout.buffer
for line in requests:
    req = json.loads(line)
    out = tempfile.NamedTemporaryFile(delete=False); err = tempfile.NamedTemporaryFile(delete=False)
    out.close(); err.close()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(os.open(out.name, os.O_WRONLY), 1)
            os.dup2(os.open(err.name, os.O_WRONLY), 2)
            sys.stdin = open(0, closefd=False)
            sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
            os.environ.clear(); os.environ.update(req["env"])
            os.chdir(req["cwd"])
            try:
                code = rag.cli.main(req["args"])
            except SystemExit as exc:  # argparse; Python prints a string code and exits 1
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            code = code or 0
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(code)
    deadline = time.monotonic() + req["timeout"]
    status = None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.005)
    with open(out.name, "rb") as fh:
        stdout = fh.read().decode("utf-8", "replace")
    with open(err.name, "rb") as fh:
        stderr = fh.read().decode("utf-8", "replace")
    os.unlink(out.name); os.unlink(err.name)
    reply = {"returncode": status, "stdout": stdout, "stderr": stderr}
    replies.write((json.dumps(reply) + "\n").encode())
    replies.flush()
"""

_lock = threading.Lock()
_zygote: subprocess.Popen | None = None


def _start() -> subprocess.Popen:
    global _zygote
    if _zygote is None or _zygote.poll() is not None:
        _zygote = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONWARNINGS": os.environ.get("PYTHONWARNINGS", "")},
        )
        atexit.register(_stop)
    return _zygote


def _stop() -> None:
    if _zygote is not None and _zygote.poll() is None:
        _zygote.stdin.close()  # type: ignore[union-attr]
        try:
            _zygote.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _zygote.kill()


def run_forked(
    args: list[str], env: dict[str, str], timeout: float, exe: str
) -> subprocess.CompletedProcess:
    """Run `rag ARGS` as a fork of the zygote; a CompletedProcess as `subprocess.run` would give."""
    request = json.dumps({"args": args, "env": env, "cwd": os.getcwd(), "timeout": timeout}) + "\n"
    with _lock:
        zygote = _start()
        assert zygote.stdin is not None and zygote.stdout is not None
        zygote.stdin.write(request.encode())
        zygote.stdin.flush()
        line = zygote.stdout.readline()
    if not line:
        raise AssertionError(
            f"the rag zygote exited ({zygote.poll()}); run the test with cold=True to see why"
        )
    reply = json.loads(line)
    if reply["returncode"] == "timeout":
        raise subprocess.TimeoutExpired([exe, *args], timeout, reply["stdout"], reply["stderr"])
    return subprocess.CompletedProcess(
        [exe, *args], reply["returncode"], reply["stdout"], reply["stderr"]
    )
