"""The real `rag` command in a subprocess: JSON shapes, exit codes, one-line errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

SOURCE_KEYS = {"n", "paper_id", "title", "authors", "url", "score", "passage", "cited"}


def test_ask_json_schema(seed_store):
    proc = run_cli("ask", "How does Palimpsa relate to Mamba2?", "--json", "--store", str(seed_store))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {"question", "answer", "mode", "outcome", "abstained", "grounding", "citations", "sources",
                         "usage", "error"}
    assert data["mode"] == "extractive" and data["abstained"] is False and data["error"] is None
    assert all(set(c) == {"n", "paper_id", "supported"} for c in data["citations"])
    assert all(set(s) == SOURCE_KEYS for s in data["sources"])
    assert data["sources"][0]["paper_id"] == "wKMV7mXjUr" and data["sources"][0]["cited"] is True
    assert len(data["sources"]) == 5


def test_ask_plain_prints_answer_and_references(seed_store):
    proc = run_cli("ask", "How does Palimpsa relate to Mamba2?", "--k", "3", "--store", str(seed_store))
    assert proc.returncode == 0, proc.stderr
    assert "[1]" in proc.stdout and "References:" in proc.stdout
    assert "Learning to Remember, Learn, and Forget in Attention-Based Models" in proc.stdout


def test_search_and_stats_json(seed_store):
    proc = run_cli("search", "debiasing CLIP attention heads", "--json", "--k", "2", "--store", str(seed_store))
    data = json.loads(proc.stdout)
    assert data["query"] == "debiasing CLIP attention heads" and data["mode"] == "hybrid"
    assert [r["paper_id"] for r in data["results"]][0] == "Sd5KwQbOdd" and len(data["results"]) == 2
    stats = json.loads(run_cli("stats", "--json", "--store", str(seed_store)).stdout)
    assert stats == {"papers": 76, "chunks": stats["chunks"], "embedding_model": "all-MiniLM-L6-v2",
                     "schema_version": 1, "store": str(seed_store)}
    plain = run_cli("stats", "--store", str(seed_store)).stdout
    assert "papers: 76" in plain.splitlines()


@pytest.mark.parametrize("args, code, message", [
    (["ask", ""], 1, "the question is empty"),
    (["ask", "   "], 1, "the question is empty"),
    (["ask", "x" * 3000], 1, "keep it under 2000"),
    (["ask", "q", "--k", "0"], 2, "k must be between 1 and 100"),
    (["ask", "q", "--k", "101"], 2, "k must be between 1 and 100"),
    (["ask", "q", "--k", "many"], 2, "expected a whole number"),
    (["ask", "q", "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["search", "q", "--mode", "fuzzy"], 2, "unknown retrieval mode 'fuzzy'; use one of: bm25, dense, hybrid"),
    (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_without_traceback(seed_store, args, code, message):
    proc = run_cli(*args, "--store", str(seed_store)) if args[0] != "frobnicate" else run_cli(*args)
    assert proc.returncode == code
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_ingest_bad_file_is_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"abstract": "fine"}\n{"abstract": \n')
    store = tmp_path / "store"
    proc = run_cli("ingest", str(bad), "--no-corpus", "--store", str(store))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"rag: error: {bad}:2: invalid JSON: expecting value at column 14; fix or remove that line"
    stats = run_cli("stats", "--json", "--store", str(store))  # nothing was written: there is no index
    assert stats.returncode == 1 and "no index at" in stats.stderr


def test_ingest_reports_and_is_idempotent(tmp_path, small_corpus):
    store = tmp_path / "store"
    first = run_cli("ingest", str(small_corpus), "--no-corpus", "--store", str(store))
    assert first.returncode == 0, first.stderr
    assert "indexed 3 new papers" in first.stdout and "1 skipped without an abstract" in first.stdout
    second = run_cli("ingest", str(small_corpus), "--no-corpus", "--store", str(store))
    assert second.returncode == 0 and "nothing new to index" in second.stdout


def test_ingest_with_no_paths_builds_a_store_of_the_bundled_papers(tmp_path):
    store = tmp_path / "fresh"
    assert run_cli("ingest", "--store", str(store)).returncode == 0
    proc = run_cli("ask", "How does Palimpsa relate to Mamba2?", "--json", "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sources"][0]["paper_id"] == "wKMV7mXjUr"
    assert json.loads(run_cli("stats", "--json", "--store", str(store)).stdout)["papers"] == 76


def test_help_is_fast_to_import():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "ingest" in proc.stdout


def test_rag_ui_serves_on_loopback(seed_store):
    """`rag ui --port N` starts the Gradio app on 127.0.0.1 and serves the page."""
    import subprocess
    import time

    import httpx

    from tests.servers import free_port

    port = free_port()
    exe = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    proc = subprocess.Popen([exe, "ui", "--port", str(port), "--store", str(seed_store)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "rag ui did not start"
                time.sleep(0.5)
        assert page.status_code == 200 and "gradio" in page.text.lower()
        assert "default-src 'self'" in page.headers["content-security-policy"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
