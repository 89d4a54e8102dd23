"""Ingest hardening: hostile or broken records are cleaned, refused with one clear line, or reported
for what they are; long ingests report progress to a log. Real store, real Chroma, real model."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import sys

import pytest

from rag import RAG
from rag.cli import main
from rag.index import ingest as ingest_module
from tests.conftest import REPO, run_cli, write_jsonl

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1: what a terminal acts on
HOSTILE = "\x1b]0;pwned\x07\x1b[2J"  # sets the window title, then clears the screen
ROUTING = (
    "A routing method for sparse mixtures of experts balances load across experts without "
    "auxiliary losses."
)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _papers(store) -> int:
    """Papers in the store; a refused first ingest may leave no manifest at all."""
    return (
        RAG(store_dir=store, llm="none").stats()["papers"]
        if (store / "papers.sqlite").exists()
        else 0
    )


def _stored_text(store) -> list[str]:
    """Every text value of the manifest's papers and chunks tables."""
    con = sqlite3.connect(store / "papers.sqlite")
    try:
        rows = con.execute(
            "SELECT paper_id, title, label, authors, url, venue, year FROM papers"
        ).fetchall()
        rows += con.execute("SELECT chunk_id, paper_id, text, abstract FROM chunks").fetchall()
    finally:
        con.close()
    return [v for row in rows for v in row if isinstance(v, str)]


def test_terminal_escapes_and_controls_are_stripped_from_every_field(tmp_path, capsys):
    row = {
        "id": "ESC0000001",
        "title": f"Sparse {HOSTILE}Routing\x9b31m",
        "authors": ["Ada\x1b[5m Lovelace", "Alan Turing\x07\x1b]8;;http://x\x1b\\"],
        "abstract": (
            f"{HOSTILE}A routing\x1b[1m method\tfor sparse\x85mixtures\x00 of experts balances load"
            " across\r\nexperts\x7f without auxiliary losses."
        ),
        "url": "https://openreview.net/forum?id=ESC0000001\x1b[8m",
        "venue": f"ICML{HOSTILE}",
        "year": 2026,
    }
    store = tmp_path / "store"
    path = write_jsonl(tmp_path / "hostile.jsonl", [row])
    code, out, err = _cli(capsys, "ingest", str(path), "--no-corpus", "--store", str(store))
    assert code == 0, err

    code, out, err = _cli(capsys, "search", "sparse mixture routing experts", "--store", str(store))
    assert code == 0, err
    assert "Sparse Routing" in out and "https://openreview.net/forum?id=ESC0000001" in out
    assert not CONTROL.search(out.replace("\n", "")), repr(out)
    assert "pwned" not in out and "[2J" not in out

    [source] = RAG(store_dir=store, llm="none").search("sparse mixture routing experts", k=1)
    assert (source.title, source.authors, source.url) == (
        "Sparse Routing",
        ["Ada Lovelace", "Alan Turing"],
        "https://openreview.net/forum?id=ESC0000001",
    )
    assert (
        "A routing method for sparse mixtures of experts balances load across experts without"
        " auxiliary losses." in source.passage
    )
    stored = _stored_text(store)
    assert (
        "ICML" in stored
        and (
            "A routing method for sparse mixtures of experts balances load across experts "
            "without auxiliary losses."
        )
        in stored
    )
    # (a chunk's text is its title, a newline, and a piece of the abstract: that newline is the
    # project's)
    assert not [v for v in stored if CONTROL.search(v.replace("\n", "")) or "pwned" in v]


SEED = REPO / "corpus/000_edb77d9566bdbf19.txt"


@pytest.mark.parametrize(
    "name, content, expect",
    [
        (
            "bad-json",
            (
                b'{"seed_file": "000_edb77d9566bdbf19.txt", "index": 1, "title":'
                b' "Fine"}\n{"seed_file": oops\n'
            ),
            (
                r"seed_metadata\.jsonl:2: invalid JSON: expecting value at column 15; fix or remove"
                r" that line"
            ),
        ),
        (
            "no-index",
            b'{"seed_file": "000_edb77d9566bdbf19.txt", "title": "No index"}\n',
            (
                r"seed_metadata\.jsonl:1: missing 'index'; each line needs \"seed_file\" .* and"
                r" \"index\""
            ),
        ),
        (
            "not-utf8",
            '{"seed_file": "000_edb77d9566bdbf19.txt", "index": 1}\n{"seed_file":'
            ' "000_edb77d9566bdbf19.txt", "index": 2, "title": "Caf\u00e9"}\n'.encode("latin-1"),
            (
                r"seed_metadata\.jsonl: not UTF-8 text \(byte \d+, line 2\); convert it with e\.g\."
                r" `iconv -t UTF-8`"
            ),
        ),
    ],
)
def test_invalid_seed_metadata_is_one_line_naming_file_and_line(tmp_path, name, content, expect):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(SEED, corpus / SEED.name)
    (corpus / "seed_metadata.jsonl").write_bytes(content)
    store = tmp_path / "store"
    proc = run_cli("ingest", str(corpus), "--no-corpus", "--store", str(store), timeout=120)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-800:]
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rag: error: {corpus}/seed_metadata.jsonl"), (
        proc.stderr
    )
    assert re.search(expect, lines[0]), lines[0]
    assert _papers(store) == 0


def test_invisible_abstracts_are_skipped_and_invisible_titles_are_missing(tmp_path, capsys):
    invisible = "\u200b\u200c\u200d\u2060\ufeff"
    rows = [
        {"id": "VIS0000001", "title": "Sparse Routing", "abstract": ROUTING},
        {"id": "VIS0000002", "title": "Ghost", "abstract": f" {invisible}\u00ad {invisible} "},
        {
            "id": "VIS0000003",
            "title": invisible,
            "abstract": (
                "We propose FOLDIFF, a diffusion model that predicts protein structures from"
                " sequences."
            ),
        },
    ]
    store = tmp_path / "store"
    code, out, err = _cli(
        capsys,
        "ingest",
        str(write_jsonl(tmp_path / "zw.jsonl", rows)),
        "--no-corpus",
        "--store",
        str(store),
    )
    assert code == 0, err
    assert out.startswith("indexed 2 new papers") and "1 skipped without an abstract" in out, out
    rag = RAG(store_dir=store, llm="none")
    assert _papers(store) == 2
    folding = rag.search("protein structure diffusion", k=1)[0]
    # a label, not blanks
    assert folding.paper_id == "VIS0000003" and folding.title.startswith("FOLDIFF")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_an_over_long_abstract_is_refused_the_same_way_in_csv_and_jsonl(tmp_path, capsys, suffix):
    """The refusal through the CLI; the acceptance at exactly the limit through `RAG.ingest` on
    `rag.testing.HashEmbedder`: the limit is checked while the file is read, before any embedding,
    and embedding that abstract's ~100 full-window chunks with the real model would cost ~15 s of
    CPU for nothing this test asserts."""
    from rag.index.corpus import MAX_ABSTRACT_CHARS
    from rag.testing import HashEmbedder

    huge = ("word " * 200_000).strip()  # 999,999 characters
    rows = [
        {"id": "LONG000001", "title": "Fine", "abstract": ROUTING},
        {"id": "LONG000002", "title": "A whole book", "abstract": huge},
    ]
    path = tmp_path / f"long{suffix}"

    def write():
        if suffix == ".csv":
            path.write_text(
                "id,title,abstract\n"
                + "".join(f"{r['id']},{r['title']},{r['abstract']}\n" for r in rows)
            )
        else:
            write_jsonl(path, rows)

    write()
    store = tmp_path / "store"
    code, out, err = _cli(capsys, "ingest", str(path), "--no-corpus", "--store", str(store))
    line = 3 if suffix == ".csv" else 2  # after the header row
    assert (code, out) == (1, "")
    assert err == (
        f"rag: error: {path}:{line}: abstract is 999,999 characters, longer than the limit "
        f"{MAX_ABSTRACT_CHARS:,}; check that the field holds an abstract (not a whole paper or "
        "text swallowed by a stray quote), then shorten it or remove that record\n"
    )
    assert _papers(store) == 0
    # Up to the limit it is an abstract like any other, in both formats. (With all-MiniLM-L6-v2's
    # window of 256 tokens, it is cut into the same 98 chunks as with the real model.)
    rows[1]["abstract"] = huge[:MAX_ABSTRACT_CHARS]
    write()
    report = RAG(store_dir=store, embedder=HashEmbedder(max_tokens=256), llm="none").ingest(
        [path], include_corpus=False
    )
    assert report.summary().startswith("indexed 2 new papers"), report.summary()


def test_a_csv_row_with_too_few_columns_says_so(tmp_path, capsys):
    path = tmp_path / "short.csv"
    path.write_text(
        "id,title,authors,abstract,url,venue,year\n"
        f"S1,Sparse Routing,Ada,{ROUTING},,ICML,2026\n"
        "S2,A title,Alan,An abstract whose line break was not quoted\n"
        "and the rest of the row,,ICML,2026\n"
    )
    store = tmp_path / "store"
    code, out, err = _cli(capsys, "ingest", str(path), "--no-corpus", "--store", str(store))
    assert code == 1
    assert (
        err == f"rag: error: {path}:3: malformed row: 4 columns, header has 7; check for a missing"
        " comma or an unquoted line break, or remove that line\n"
    )
    assert _papers(store) == 0


def test_a_repeated_record_is_a_duplicate_within_the_input_not_already_indexed(tmp_path, capsys):
    row = {"id": "DUP0000001", "title": "Sparse Routing", "abstract": ROUTING}
    path = write_jsonl(
        tmp_path / "dup.jsonl",
        [row, {"id": "DUP0000002", "title": "Other", "abstract": "Other."}, row],
    )
    store = tmp_path / "store"
    code, out, err = _cli(capsys, "ingest", str(path), "--no-corpus", "--store", str(store))
    assert code == 0, err
    assert out.strip() == (
        f"indexed 2 new papers (2 chunks); 3 records read from 1 file, "
        f"1 duplicate within the input ({path}:3 repeats {path}:1)"
    )
    again = RAG(store_dir=store, llm="none").ingest([path], include_corpus=False)
    assert (again.already_indexed, again.duplicates) == (3, 0) and again.wrote_nothing


def test_summary_of_one_paper_is_singular(tmp_path, capsys):
    path = write_jsonl(
        tmp_path / "one.jsonl",
        [{"id": "ONE0000001", "title": "Sparse Routing", "abstract": ROUTING}],
    )
    code, out, err = _cli(
        capsys, "ingest", str(path), "--no-corpus", "--store", str(tmp_path / "store")
    )
    assert code == 0, err
    assert out == "indexed 1 new paper (1 chunk); 1 record read from 1 file\n"


def test_a_json_error_is_a_whole_sentence_with_line_and_column(tmp_path, capsys):
    path = tmp_path / "cut.jsonl"
    path.write_text(
        json.dumps({"id": "J1", "abstract": ROUTING}) + '\n{"id": "J2", "abstract": "no end\n'
    )
    code, out, err = _cli(
        capsys, "ingest", str(path), "--no-corpus", "--store", str(tmp_path / "store")
    )
    assert code == 1
    assert (
        err == f"rag: error: {path}:2: invalid JSON: unterminated string starting at column 26; "
        "fix or remove that line\n"
    )


def test_progress_lines_go_to_a_log_when_stderr_is_not_a_terminal(
    tmp_path, monkeypatch, capsys, small_corpus
):
    monkeypatch.setattr(ingest_module, "PAPERS_PER_BATCH", 2)  # 4 abstracts: two batches
    log = tmp_path / "ingest.log"

    def ingest(store: str, interval: float) -> list[str]:
        monkeypatch.setattr(ingest_module, "PROGRESS_INTERVAL_S", interval)
        with open(log, "w") as fh, monkeypatch.context() as m:
            m.setattr(sys, "stderr", fh)  # a real file, as under nohup or CI
            code = main(
                ["ingest", str(small_corpus), "--no-corpus", "--store", str(tmp_path / store)]
            )
        assert code == 0
        assert capsys.readouterr().out.startswith("indexed 3 new papers")
        return log.read_text().splitlines()

    assert ingest("quiet", 3600.0) == []  # within the interval: nothing but the summary
    lines = ingest("logged", 0.0)
    assert len(lines) == 1 and re.fullmatch(
        r"rag: ingest: 2/4 abstracts \(50%\), \d+s elapsed, ~\d+s left", lines[0]
    ), lines
