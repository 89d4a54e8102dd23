"""Every code block of README.md and docs/*.md runs as written, or says why not.

A block marked `<!-- not run: why -->` on the line before its fence is skipped (the reason must be
given). Every other block runs, offline, in a fresh directory holding `papers.jsonl` (three seed
records) with a copy of the seed store as the default store and no LLM:
- `bash`: each command; lines that set up the environment the test already is (`python3 -m venv`,
  `. .venv/bin/activate`, `pip install -e .`) are skipped, and only `rag` commands may remain;
- `console`: each `$ ` line, which must exit 0;
- `python`: the block as a script;
- `json`: parsed.
A block in another language, or a block without a language, is output and is not checked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!-- not run: (.+?) -->$")
# A block that needs `rag serve` running: test_the_http_api_blocks_run_against_a_server runs it.
SERVED = re.compile(r"^<!-- with rag serve: (.+?) -->$")
SETUP = ("python3 -m venv", ". .venv/bin/activate", "pip install -e .", "pip install -e '.")
LONG_RUNNING = ("rag ui", "rag serve", "rag mcp")


def blocks():
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = FENCE.match(lines[i])
            if not m:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = NOT_RUN.match(lines[i - 1]) if i else None
            served = SERVED.match(lines[i - 1]) if i else None
            yield pytest.param(
                path,
                m.group(1),
                "\n".join(lines[i + 1 : end]),
                marker.group(1) if marker else served and f"with rag serve: {served.group(1)}",
                id=f"{path.relative_to(REPO)}:{i + 1}",
            )
            i = end + 1


def commands(language: str, text: str) -> list[str]:
    out = []
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if language == "console":
            if line.startswith("$ "):
                out.append(line[2:])
            continue
        line = re.sub(r"\s+#.*$", "", line)
        if not line or line.startswith("#"):
            continue
        for part in line.split("&&"):
            part = part.strip()
            if not part.startswith(SETUP):
                out.append(part)
    return out


@pytest.fixture(scope="module")
def workdir(seed_store, tmp_path_factory):
    where = tmp_path_factory.mktemp("docs")
    shutil.copytree(seed_store, where / "store")
    rows = [
        json.loads(line)
        for line in (REPO / "corpus/seed_metadata.jsonl").read_text().splitlines()[:3]
    ]
    (where / "papers.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "title": r["title"],
                    "abstract": r.get("abstract") or r["title"] + " is studied here.",
                    "url": r["openreview_url"],
                }
            )
            + "\n"
            for r in rows
        )
    )
    env = {
        **os.environ,
        "RAG_STORE_DIR": str(where / "store"),
        "RAG_LLM": "none",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    return where, env


@pytest.mark.parametrize(("path", "language", "text", "not_run"), list(blocks()))
def test_the_block_runs_as_written(path, language, text, not_run, workdir):
    if not_run is not None:
        assert len(not_run.strip()) >= 10, "say why the block is not run"
        pytest.skip(f"not run: {not_run}")
    where, env = workdir
    if language == "json":
        json.loads(text)
    elif language == "python":
        r = subprocess.run(
            [sys.executable, "-c", text],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr[-2000:]
    elif language in ("bash", "console"):
        for command in commands(language, text):
            assert command.startswith("rag ") and not command.startswith(LONG_RUNNING), (
                f"{command!r} cannot run in a test: mark the block <!-- not run: why -->"
            )
            r = subprocess.run(
                command, shell=True, cwd=where, env=env, capture_output=True, text=True, timeout=600
            )
            assert r.returncode == 0, f"{command}: {r.stderr[-2000:]}"
            assert r.stdout.strip(), f"{command} printed nothing"


def _extras_closure(extras: set[str]) -> list[str]:
    """What an install with `extras` pulls from pyproject.toml (extras of extras too)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional, seen, out = project["optional-dependencies"], set(), list(project["dependencies"])
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional[extra]:
            inner = re.match(r"rag-papers\[([\w,]+)\]", req)
            if inner:
                todo += inner.group(1).split(",")
            else:
                out.append(req)
    return out


def test_the_quickstart_install_reaches_the_chat():
    """The README's first command installs what `rag ui` needs: the chat is two commands away, as
    `rag ask` is (issue 51)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    install = re.search(r"pip install -e (\S+)", readme.split("## Quickstart", 1)[1]).group(1)
    extras = set(re.findall(r"\[([\w,]+)\]", install)[0].split(",")) if "[" in install else set()
    needed = {"gradio", "openTSNE", "scikit-learn", "starlette"}  # rag/extras.py's ui check
    assert needed <= {re.split(r"[<>=\[ ]", r)[0] for r in _extras_closure(extras)}, install


def _served_blocks() -> dict[str, str]:
    """docs/http-api.md's blocks that need `rag serve`, by language."""
    return {
        p.values[1]: p.values[2]
        for p in blocks()
        if p.values[0].name == "http-api.md" and (p.values[3] or "").startswith("with rag serve")
    }


def test_the_http_api_blocks_run_against_a_server(workdir):
    """The HTTP API page's bash block as written (it starts `rag serve`, waits until it answers,
    then calls it with curl), and its Python block with the openai client against a server: on a
    free port instead of 8000, else word for word."""
    from tests.harness import free_port, popen_logged, stop_process, wait_http_ready

    where, env = workdir
    served = _served_blocks()
    assert set(served) == {"bash", "python"}, served
    port = str(free_port())
    env = {**env, "RAG_API_PORT": port}
    script = served["bash"].replace("8000", port) + "\nkill %1; wait || true\n"
    r = subprocess.run(
        ["bash", "-c", script], cwd=where, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Palimpsa" in r.stdout and "data: [DONE]" in r.stdout, r.stdout[-2000:]
    assert '"status":"ok"' in r.stdout.replace(" ", "") and "wKMV7mXjUr" in r.stdout
    env = {**env, "RAG_API_KEY": "docs-key"}
    log = where / "serve.log"
    proc = popen_logged(["rag", "serve", "--port", port], log, env, where)
    try:
        wait_http_ready(proc, f"http://127.0.0.1:{port}/healthz", log, 120)
        r = subprocess.run(
            [sys.executable, "-c", served["python"].replace("8000", port)],
            cwd=where,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stop_process(proc)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Palimpsa" in r.stdout and "References:" in r.stdout, r.stdout[-2000:]
