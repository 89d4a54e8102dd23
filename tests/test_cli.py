"""The real `rag` command in a subprocess: JSON shapes, exit codes, one-line errors."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

# ../shared/CONTRACT.md
SOURCE_KEYS = {"n", "paper_id", "title", "authors", "url", "score", "passage", "cited"}
# The line under each result of `rag search`: every number named.
SCORES_LINE = re.compile(r"^    fused (\d\.\d\d) · cosine (-?\d\.\d\d) · keyword (\d+\.\d)$")


def test_ask_json_schema(seed_store):
    proc = run_cli(
        "ask", "How does Palimpsa relate to Mamba2?", "--json", "--store", str(seed_store)
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == {
        "question",
        "answer",
        "mode",
        "outcome",
        "abstained",
        "grounding",
        "citations",
        "sources",
        "usage",
        "error",
    }
    assert data["mode"] == "extractive" and data["abstained"] is False and data["error"] is None
    assert all(set(c) == {"n", "paper_id", "supported"} for c in data["citations"])
    assert all(set(s) == SOURCE_KEYS for s in data["sources"])
    assert data["sources"][0]["paper_id"] == "wKMV7mXjUr" and data["sources"][0]["cited"] is True
    assert len(data["sources"]) == 5


def test_ask_plain_prints_answer_and_references(seed_store):
    proc = run_cli(
        "ask", "How does Palimpsa relate to Mamba2?", "--k", "3", "--store", str(seed_store)
    )
    assert proc.returncode == 0, proc.stderr
    assert "[1]" in proc.stdout and "References:" in proc.stdout
    assert "Learning to Remember, Learn, and Forget in Attention-Based Models" in proc.stdout


def test_search_and_stats_json(seed_store):
    proc = run_cli(
        "search", "debiasing CLIP attention heads", "--json", "--k", "2", "--store", str(seed_store)
    )
    data = json.loads(proc.stdout)
    assert data["query"] == "debiasing CLIP attention heads" and data["mode"] == "hybrid"
    assert [r["paper_id"] for r in data["results"]][0] == "Sd5KwQbOdd" and len(data["results"]) == 2
    stats = json.loads(run_cli("stats", "--json", "--store", str(seed_store)).stdout)
    assert stats == {
        "papers": 76,
        "chunks": stats["chunks"],
        "embedding_model": "minilm-l6-ml-v1",
        "schema_version": 1,
        "store": str(seed_store),
        "chroma_path": str(seed_store / "chroma"),
        "chroma_url": None,
        "collection": "papers",
    }
    plain = run_cli("stats", "--store", str(seed_store)).stdout
    assert "papers: 76" in plain.splitlines()


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["ask", ""], 1, "the question is empty"),
        (["ask", "   "], 1, "the question is empty"),
        (["ask", "x" * 3000], 1, "keep it under 2000"),
        (["ask", "q", "--k", "0"], 2, "k must be between 1 and 100"),
        (["ask", "q", "--k", "101"], 2, "k must be between 1 and 100"),
        (["ask", "q", "--k", "many"], 2, "expected a whole number"),
        (["ask", "q", "--bogus"], 2, "unrecognized arguments: --bogus"),
        (
            ["search", "q", "--mode", "fuzzy"],
            2,
            "unknown retrieval mode 'fuzzy'; use one of: bm25, dense, hybrid",
        ),
        (["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ],
)
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
    assert (
        proc.stderr.strip()
        == f"rag: error: {bad}:2: invalid JSON: expecting value at column 14; fix or remove that"
        " line"
    )
    # nothing was written: there is no index
    stats = run_cli("stats", "--json", "--store", str(store))
    assert stats.returncode == 1 and "no index at" in stats.stderr


def test_ingest_reports_and_is_idempotent(tmp_path, small_corpus):
    store = tmp_path / "store"
    first = run_cli("ingest", str(small_corpus), "--no-corpus", "--store", str(store))
    assert first.returncode == 0, first.stderr
    assert (
        "indexed 3 new papers" in first.stdout and "1 skipped without an abstract" in first.stdout
    )
    second = run_cli("ingest", str(small_corpus), "--no-corpus", "--store", str(store))
    assert second.returncode == 0 and "nothing new to index" in second.stdout


@pytest.mark.slow
def test_ingest_with_no_paths_builds_a_store_of_the_bundled_papers(tmp_path):
    store = tmp_path / "fresh"
    assert run_cli("ingest", "--store", str(store)).returncode == 0
    proc = run_cli("ask", "How does Palimpsa relate to Mamba2?", "--json", "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sources"][0]["paper_id"] == "wKMV7mXjUr"
    assert json.loads(run_cli("stats", "--json", "--store", str(store)).stdout)["papers"] == 76


def test_search_shows_the_score_it_is_sorted_by_and_names_the_others(seed_store):
    """`rag search` lists results in fused order: the number it shows first is that fused score,
    which never rises down the list, and the cosine and keyword matches beside it are named as such
    (they may rise: 0.25 above 0.37 below). The JSON keeps the contract's keys: `n` is the rank,
    `score` the cosine."""
    query = "debiasing CLIP attention heads"
    proc = run_cli("search", query, "--k", "5", "--store", str(seed_store))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(
        "Sorted by fused score (reciprocal rank fusion of the keyword and meaning rankings"
    )
    titles = [line for line in lines if re.match(r"\[\d+\] ", line)]
    shown = [SCORES_LINE.match(line) for line in lines if line.startswith("    fused ")]
    assert len(titles) == len(shown) == 5 and all(shown), proc.stdout
    fused = [float(m.group(1)) for m in shown if m]
    assert fused == sorted(fused, reverse=True), fused
    assert not re.search(r"(similarity|score) \d", proc.stdout)  # no number without its name

    results = json.loads(
        run_cli("search", query, "--k", "5", "--json", "--store", str(seed_store)).stdout
    )["results"]
    # The JSON keeps the contract's keys: `n` is the rank, `score` the cosine the text labels as
    # such.
    assert all(set(r) == SOURCE_KEYS for r in results)
    assert [r["n"] for r in results] == [1, 2, 3, 4, 5]
    assert [r["title"] for r in results] == [
        re.sub(r"^\[\d+\] (.*) \(\w+\)$", r"\1", t) for t in titles
    ]
    cosines = [r["score"] for r in results]
    assert [f"{x:.2f}" for x in cosines] == [m.group(2) for m in shown if m]
    # The case that read as a bug: the cosines do not fall with the rank, and are labelled, not the
    # order.
    assert cosines != sorted(cosines, reverse=True)


def test_help_is_fast_to_import():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "ingest" in proc.stdout
    assert (
        "examples:" in proc.stdout
        and 'rag ask "How does Palimpsa relate to Mamba2?"' in proc.stdout
    )


def test_version_prints_the_package_version():
    proc = run_cli("--version")
    assert (
        proc.returncode == 0
        and proc.stdout.strip() == f"rag {importlib.metadata.version('rag-papers')}"
    )


@pytest.mark.parametrize(
    "command, positional",
    [
        ("ask", "question"),
        ("search", "query"),
        ("cite", "PAPER_ID"),
        ("ingest", "PATH"),
        ("eval", "questions"),
    ],
)
def test_every_positional_has_help(capsys, command, positional):
    from rag.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    listed = text.split("positional arguments:")[1].split("options:")[0]
    # a line of help after its name
    assert re.search(rf"^  {positional}\s+\S", listed, re.M), listed


def test_ingest_rebuild_into_a_store_of_ones_own_holds_only_the_paths(
    tmp_path, small_corpus, capsys
):
    """--rebuild's help says what it does with --store: empty it, then ingest the PATHs, and not the
    bundled papers (they go in with no PATHs, into the default store, or with --with-corpus)."""
    from rag.cli import main

    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert "--rebuild empty the store first, then ingest PATHs" in helptext
    assert "never into a --store DIR otherwise" in helptext
    store = tmp_path / "store"
    other = tmp_path / "one.jsonl"
    other.write_text(
        json.dumps(
            {
                "id": "CCCCCCCCC3",
                "title": "Only One",
                "abstract": "A single abstract about tabular transformers.",
            }
        )
        + "\n"
    )
    assert run_cli("ingest", str(other), "--no-corpus", "--store", str(store)).returncode == 0
    proc = run_cli("ingest", "--rebuild", str(small_corpus), "--store", str(store))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(run_cli("stats", "--json", "--store", str(store)).stdout)["papers"] == 3


@pytest.mark.slow
def test_rag_ui_serves_on_loopback(seed_store):
    """`rag ui --port N` starts the Gradio app on 127.0.0.1 and serves the page."""
    import subprocess
    import time

    import httpx

    from tests.servers import free_port

    port = free_port()
    exe = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    proc = subprocess.Popen(
        [exe, "ui", "--port", str(port), "--store", str(seed_store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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


def test_titles_with_latex_read_as_text_in_the_terminal(seed_store):
    """The terminal shows LaTeX as Unicode text: `$\\textit{S}$-SPPO` reads "S-SPPO" in `rag search`
    and in an answer's references (the browser chat draws it as math)."""
    for args in (
        ("search", "S-SPPO supervision calibration representation calibration", "--k", "3"),
        ("ask", "How does S-SPPO implement supervision calibration?", "--no-llm"),
    ):
        proc = run_cli(*args, "--store", str(seed_store))
        assert proc.returncode == 0, proc.stderr
        line = next(
            line for line in proc.stdout.splitlines() if "SPPO" in line and "Self-Play" in line
        )
        assert (
            "S-SPPO: Semantic-Calibrated Self-Play" in line
            and "$" not in line
            and "\\textit" not in line
        )


def test_an_answer_reads_as_text_in_the_terminal():
    """Quotes and a model's words as the terminal shows them: `\\emph{}`, markdown emphasis and
    LaTeX escapes gone, escaped citation brackets already plain; a backslash split from its `%`
    still joins."""
    from rag.cli import TerminalText

    t = TerminalText()
    block = t.feed(
        "\n\n- memory must become both \\emph{self-checking} and **F**unction-**I**nformed [1]\n-"
        " R$^2$ [2]"
    )
    assert (
        block == "\n\n- memory must become both self-checking and Function-Informed [1]\n- R² [2]"
    )
    t = TerminalText()
    assert (
        t.feed("accuracy rose to 95\\") + t.feed("% [1]") + t.close() == "accuracy rose to 95% [1]"
    )


def test_ingest_suggests_the_trained_embedding_model_once_a_store_passes_a_thousand_papers():
    from rag.cli import ML_TIP_PAPERS, embedder_tip

    low, high = ML_TIP_PAPERS
    tip = embedder_tip("all-MiniLM-L6-v2", 76, 5_871, "/data/papers")
    assert tip and "5,871 papers" in tip and "--also-store" in tip
    assert "RAG_EMBED_MODEL=minilm-l6-ml-v1 rag repair --store /data/papers" in tip
    assert "\n" not in tip
    assert embedder_tip("all-MiniLM-L6-v2", 0, low) is not None  # the ingest that reaches the bound
    # said once, not on every later ingest
    assert embedder_tip("all-MiniLM-L6-v2", low, low + 500) is None
    # few papers: the model it was trained from finds them
    assert embedder_tip("all-MiniLM-L6-v2", 0, low - 1) is None
    assert embedder_tip("all-MiniLM-L6-v2", 0, high + 1) is None
    assert embedder_tip("minilm-l6-ml-v1", 0, 5_871) is None  # already the trained model
    assert embedder_tip("all-mpnet-base-v2", 0, 5_871) is None


def test_ask_shows_only_the_checked_answer(seed_store):
    """Nothing shown is taken back: a synthesis the check drops (here the README example's swapped
    subject, from a scripted OpenAI-compatible stub on loopback) never reaches the terminal, the
    answer is printed once, as checked, and stdout is exactly what `--json` says the answer is."""
    from rag import RAG
    from rag.answer import evidence
    from tests.obedient_server import ObedientServer

    question = "How does Palimpsa relate to Mamba2?"
    first = evidence.source_sentences(
        RAG(store_dir=seed_store, llm="none")._retrieve(question)[0].chunk.abstract
    )
    i = next(i for i, s in enumerate(first, 1) if "Mamba2 is a special case of Palimpsa" in s)
    for synthesis, kept in (
        ("Palimpsa is a special case of Palimpsa where forgetting dominates [1].", False),
        ("Mamba2 is a special case of Palimpsa where forgetting dominates [1].", True),
    ):
        env = {"RAG_LLM": "openai", "RAG_LLM_CHECK": "false", "OPENAI_API_KEY": "sk-test"}
        with ObedientServer(reply=f"EVIDENCE: 1.{i}\nANSWER: {synthesis}") as server:
            env |= {"OPENAI_BASE_URL": server.base_url, "RAG_LLM_MODEL": server.model}
            r = run_cli("ask", "--store", str(seed_store), question, env=env)
            js = run_cli("ask", "--store", str(seed_store), "--json", question, env=env)
        assert r.returncode == 0 and js.returncode == 0, r.stderr + js.stderr
        assert "differs" not in r.stderr and "checked:" not in r.stdout
        answer = json.loads(js.stdout)["answer"]
        body = r.stdout.partition("\nReferences:")[0]
        assert ("Palimpsa is a special case" in body) is False
        assert (synthesis.removesuffix(" [1].") in body) is kept
        assert body.count(first[i - 1]) == 1  # the quote, once
        assert answer.strip() and r.stdout.count("References:") == 1  # printed once


def _stub_env(stub) -> dict[str, str]:
    """This process's environment with `rag ask` pointed at a scripted model stub on loopback."""
    import os

    return {
        **os.environ,
        "RAG_LLM": "openai",
        "OPENAI_BASE_URL": stub.base_url,
        "RAG_LLM_MODEL": stub.model,
        "OPENAI_API_KEY": "sk-test",
        "RAG_LLM_CHECK": "false",
    }


def test_ask_at_a_terminal_lists_the_papers_before_the_model_writes(seed_store):
    """At a terminal, the papers found are listed on stderr (status, not the answer: stdout stays
    empty) while the model still reads: a scripted OpenAI-compatible stub on loopback that holds its
    first token for 60 s has sent nothing when the list shows."""
    import os
    import pty
    import subprocess
    import time

    from tests.faultproxy import ModelStub

    reply = "EVIDENCE: 1.1\nANSWER: Palimpsa uses Bayesian metaplasticity [1]."
    with ModelStub(text=reply, tokens=12, first_token_delay=60) as stub:
        env = _stub_env(stub)
        master, slave = pty.openpty()
        exe = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
        proc = subprocess.Popen(
            [exe, "ask", "--store", str(seed_store), "How does Palimpsa relate to Mamba2?"],
            stdout=subprocess.PIPE,
            stderr=slave,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        os.close(slave)
        err, deadline = b"", time.monotonic() + 120
        try:
            while b"the model is reading" not in err and time.monotonic() < deadline:
                err += os.read(master, 4096)
            sent = stub.streams[0].tokens_sent if stub.streams else 0
        finally:
            proc.kill()
            out = proc.communicate()[0]
            os.close(master)
    text = err.decode()
    assert "rag: found 5 papers:" in text and "Learning to Remember, Learn, and Forget" in text
    assert sent == 0 and out == b""  # the model had written nothing; stdout holds only answers


def test_ask_shows_the_quotes_while_the_model_still_writes(seed_store):
    """The quotes the model names are printed as soon as its evidence line is read, before it has
    written its synthesis: a scripted OpenAI-compatible stub on loopback sends a word a second,
    and the quote is on stdout while words are still to come; the synthesis follows under it."""
    import os
    import selectors
    import subprocess
    import time

    from tests.faultproxy import ModelStub

    reply = "EVIDENCE: 1.1\nANSWER: Palimpsa uses Bayesian metaplasticity [1]."
    words = len(reply.split(" "))
    with ModelStub(text=reply, tokens=words, interval=1.0) as stub:
        env = _stub_env(stub)
        exe = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
        proc = subprocess.Popen(
            [exe, "ask", "--store", str(seed_store), "How does Palimpsa relate to Mamba2?"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        assert proc.stdout is not None
        # a selector, not select(): under xdist a worker's descriptors pass select()'s 1024
        ready = selectors.DefaultSelector()
        ready.register(proc.stdout, selectors.EVENT_READ)
        out, deadline = b"", time.monotonic() + 120
        while b"- " not in out and time.monotonic() < deadline:
            if ready.select(timeout=0.5):
                out += os.read(proc.stdout.fileno(), 4096)
        sent = stub.streams[0].tokens_sent if stub.streams else 0
        rest = proc.communicate(timeout=120)[0]
    assert out.startswith(b"- ") and sent < words  # the quote came before the last words
    text = (out + rest).decode()
    assert proc.returncode == 0 and "\n\nPalimpsa uses Bayesian metaplasticity [1]." in text
