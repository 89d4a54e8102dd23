"""Several `rag` commands in one fresh process: for tests that look at a store at one moment with
several commands.

    stats, search = run_cli_batch(["stats", "--json", "--store", s], ["search", "Palimpsa",
"--store", s]) assert stats.returncode == 0 and search.stderr == ""

Each command runs through `rag.cli.main`, which is all the `rag` executable runs, with its own exit
code, stdout and stderr (captured at the file-descriptor level, so what a C library writes is caught
too; an exception that escapes `main` becomes a traceback on that command's stderr and exit 1, as in
a process of its own). Between commands, chromadb's per-path client cache is dropped and the warning
registry reset, so each command opens the store and reports warnings as a fresh process would.

What it saves: starting Python, importing the stack and loading the embedding model, about 1.4 s of
CPU per `rag search` on the CI machine, paid once per batch instead of once per command (a repeated
search costs ~0.05 s). Use it only where nothing else writes to the store between the commands of
one batch (commands in the batch may write, in order, as they would one after another), and where a
command's cold start is not what the test is about: then use `tests.conftest.run_cli`, one process
per command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs in the child. stdout/stderr of each command go to their own temporary files through fd 1 and
# 2.
_RUNNER = r"""
import json, os, sys, tempfile, time, traceback, warnings

# a file, not argv: one argument holds at most 128 KiB
with open(sys.argv[1], encoding="utf-8") as fh:
    commands = json.load(fh)
result_path, while_pid, pause = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
sys.argv[0] = "rag"  # argparse's prog, as in the `rag` executable
from rag.cli import main


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has finished
    except OSError:
        return False


def plan():
    yield from commands
    while while_pid and alive(while_pid):
        for argv in commands:
            time.sleep(pause)
            yield argv


results = []
for argv in plan():
    try:  # a fresh process has no cached Chroma client for this path
        from chromadb.api.shared_system_client import SharedSystemClient
        SharedSystemClient.clear_system_cache()
    except Exception:
        pass
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush(); sys.stderr.flush()
        started = time.time()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            # entering it resets the "shown once" registry: shown again, as fresh
            with warnings.catch_warnings():
                code = main(argv)
        except SystemExit as exc:  # argparse; Python prints a string code and exits 1
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
        ended = time.time()
        out.seek(0); err.seek(0)
        results.append({"args": argv, "returncode": code, "started": started, "ended": ended,
                        "stdout": out.read().decode("utf-8", "replace"),
                        "stderr": err.read().decode("utf-8", "replace")})
with open(result_path, "w", encoding="utf-8") as fh:
    json.dump(results, fh)
"""


class BatchedRun(subprocess.CompletedProcess):
    """One command's result, with when it ran (`time.time()` in the child: `started`, `ended`)."""

    def __init__(
        self,
        args: list[str],
        returncode: int,
        stdout: str,
        stderr: str,
        started: float,
        ended: float,
    ) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.started, self.ended = started, ended


def run_cli_batch(
    *commands: list,
    env: dict | None = None,
    timeout: float = 300,
    while_pid: int = 0,
    pause: float = 0.0,
) -> list[BatchedRun]:
    """Run each argv (without the leading `rag`) in order in one new process; one CompletedProcess
    each.

    With `while_pid`, the commands run again and again, `pause` seconds apart, for as long as that
    process runs (a searcher beside an ingest: one process for the whole ingest, and the pauses
    leave it the CPU)."""
    with tempfile.TemporaryDirectory(prefix="rag-cli-batch-") as tmp:
        result_path = Path(tmp) / "results.json"
        commands_path = Path(tmp) / "commands.json"
        commands_path.write_text(
            json.dumps([[str(a) for a in c] for c in commands]), encoding="utf-8"
        )
        argv = [
            sys.executable,
            "-c",
            _RUNNER,
            str(commands_path),
            str(result_path),
            str(while_pid),
            str(pause),
        ]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or not result_path.exists():
            raise AssertionError(
                f"the batch of rag commands itself failed (exit {proc.returncode}): "
                f"{proc.stderr[-3000:]}"
            )
        results = json.loads(result_path.read_text(encoding="utf-8"))
    return [
        BatchedRun(
            ["rag", *r["args"]], r["returncode"], r["stdout"], r["stderr"], r["started"], r["ended"]
        )
        for r in results
    ]
