"""Corpus parsing: seed files, JSONL/CSV/.gz, ids, labels and bad input."""

from __future__ import annotations

import gzip
import json

import pytest

from rag.errors import CorpusError
from rag.index.corpus import content_id, derive_label, expand_paths, parse_file
from tests.conftest import ICML_SAMPLE, REPO, SHARED, icml_rows, write_jsonl


def test_seed_corpus_has_76_papers_with_openreview_ids_and_titles(seed_titles):
    records = [r for f in expand_paths([REPO / "corpus"]) for r in parse_file(f).records]
    assert len(records) == 76
    assert {r.paper_id for r in records} == set(seed_titles)
    assert all(r.title == seed_titles[r.paper_id] for r in records)
    assert all(r.authors and r.url for r in records)


@pytest.mark.large_data
def test_seed_files_are_the_shared_seeds_unchanged():
    for src in sorted((SHARED / "seeds").glob("*.txt")):
        assert (REPO / "corpus" / src.name).read_bytes() == src.read_bytes()


def test_seed_file_without_metadata_gets_content_ids_and_labels(tmp_path):
    text = (REPO / "corpus/000_edb77d9566bdbf19.txt").read_text()
    path = tmp_path / "mine.txt"
    path.write_text(text)
    records = parse_file(path).records
    assert len(records) == len({r.paper_id for r in records}) > 10
    assert records[1].paper_id == content_id("", records[1].abstract)
    assert records[1].title == "" and records[1].label.startswith("Palimpsa")
    assert parse_file(path).records[1].paper_id == records[1].paper_id  # stable


@pytest.mark.parametrize(
    "abstract, label",
    [
        ("We propose NAVI, a segment-centric pretraining framework for tables.", "NAVI"),
        (
            "In this work we introduce FedARC (federated adaptive routing) to couple models.",
            "FedARC",
        ),
        (
            (
                "Large models are everywhere and nobody knows why they work so well in practice at"
                " all."
            ),
            "Large models",
        ),
    ],
)
def test_label_names_the_method_or_starts_the_abstract(abstract, label):
    assert derive_label(abstract).startswith(label)


def test_jsonl_aliases_ids_and_skips(tmp_path, small_corpus):
    parsed = parse_file(small_corpus)
    assert parsed.skipped == 1
    ids = [r.paper_id for r in parsed.records]
    assert ids[:3] == ["AAAAAAAAA1", "BBBBBBBBB2", "AAAAAAAAA1"]
    assert len(ids[3]) == 12 and ids[3] == content_id(
        "Graph Transformers for Molecules", parsed.records[3].abstract
    )
    assert parsed.records[1].authors == ["Alan Turing", "Grace Hopper"]
    rows = [
        {"id": "42", "conference": "NeurIPS", "year": 2019, "title": "T", "summary": "An abstract."}
    ]
    rec = parse_file(write_jsonl(tmp_path / "alias.jsonl", rows)).records[0]
    assert (rec.paper_id, rec.venue, rec.year, rec.abstract) == (
        "neurips-2019-42",
        "NeurIPS",
        "2019",
        "An abstract.",
    )


def test_csv_and_gzip(tmp_path):
    csv_text = (
        'title,authors,abstract,url\nA CSV paper,"Ann; Bob",It studies CSV'
        " parsing.,https://openreview.net/forum?id=CSV123\n"
    )
    (tmp_path / "p.csv").write_text(csv_text)
    rec = parse_file(tmp_path / "p.csv").records[0]
    assert (rec.paper_id, rec.authors) == ("CSV123", ["Ann", "Bob"])
    gz = tmp_path / "p.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(json.dumps({"id": "X1", "title": "T", "abstract": "A b c."}) + "\n")
    assert parse_file(gz).records[0].abstract == "A b c."


def test_real_icml_file_parses_with_null_ids():
    """The shipped sample of the ICML 2026 file: every record parsed, the ones without an id given
    the content hash (12 hex characters) as their id."""
    parsed = parse_file(ICML_SAMPLE)
    rows = icml_rows()
    assert len(parsed.records) == len(rows) == 678
    hashed = [r for r in parsed.records if len(r.paper_id) == 12 and r.url in (None, "")]
    assert len(hashed) == sum(1 for r in rows if not r["id"]) == 11


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", b'{"abstract": "ok"}\n{"abstract": broken\n', r"bad.jsonl:2: invalid JSON"),
        ("list.jsonl", b"[1, 2]\n", r"list.jsonl:1: expected a JSON object"),
        (
            "types.jsonl",
            b'{"abstract": {"x": 1}}\n',
            r"types.jsonl:1: field 'abstract' should be text",
        ),
        (
            "latin1.jsonl",
            '{"abstract": "caf\u00e9"}\n'.encode("latin-1"),
            r"latin1.jsonl: not UTF-8",
        ),
        ("binary.txt", b"\x00\x01\x02binary", r"binary.txt: looks like a binary file"),
        (
            "trunc.jsonl.gz",
            gzip.compress(b'{"abstract": "x"}\n' * 50, mtime=0)[:-20],
            r"trunc.jsonl.gz: not a valid gzip",
        ),
        ("nocol.csv", b"title,url\nA,B\n", r"nocol.csv:1: CSV header has no 'abstract'"),
        ("paper.pdf", b"%PDF", r"paper.pdf: unsupported file type"),
        (
            "cut.jsonl",
            b'{"abstract": "no end\n',
            (
                r"cut.jsonl:1: invalid JSON: unterminated string starting at column 14; fix or"
                r" remove that line$"
            ),
        ),
        (
            "cut.json",
            b'[{"abstract": "x"},\n {"abstract": }]',
            (
                r"cut.json:2: invalid JSON: expecting value at column 15; fix the file and run the"
                r" ingest again$"
            ),
        ),
        (
            "short.csv",
            b"id,title,abstract\nA,B\n",
            r"short.csv:2: malformed row: 2 columns, header has 3; check for a missing",
        ),
        (
            "long.txt",
            b"ICML\n\nshort one.\n\n" + b"x " * 60_000 + b"\n",
            r"long.txt:5: abstract is 119,999 characters, longer than the limit 100,000",
        ),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=message):
        parse_file(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CorpusError, match="nope.jsonl: no such file"):
        parse_file(tmp_path / "nope.jsonl")


def test_empty_file_has_no_records(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    assert parse_file(tmp_path / "empty.jsonl").records == []


def test_escape_sequences_and_controls_are_removed_in_every_format(tmp_path):
    hostile = "\x1b]0;pwned\x07\x1b[2J"
    (tmp_path / "p.csv").write_text(
        f"id,title,abstract,venue\nE1,Clean{hostile} title\x9b2J,An\x07 abstract\x1bc here.,"
        f"ICML{hostile}\n"
    )
    rec = parse_file(tmp_path / "p.csv").records[0]
    assert (rec.title, rec.abstract, rec.venue) == ("Clean title", "An abstract here.", "ICML")
    (tmp_path / "seed.txt").write_text(
        f"ICML 2026{hostile}\n\nFirst\x1b[31m abstract\x85of the\x01 seeds.\n"
    )
    rec = parse_file(tmp_path / "seed.txt").records[0]
    assert (rec.venue, rec.abstract) == ("ICML 2026", "First abstract of the seeds.")


def test_invisible_paragraphs_of_a_seed_file_are_skipped_and_keep_their_number(tmp_path):
    (tmp_path / "mine.txt").write_text(
        "Venue\n\nFirst abstract.\n\n\u200b\u2060\ufeff\n\nThird abstract.\n"
    )
    (tmp_path / "seed_metadata.jsonl").write_text(
        json.dumps({"seed_file": "mine.txt", "index": 3, "title": "Third"}) + "\n"
    )
    parsed = parse_file(tmp_path / "mine.txt")
    assert parsed.skipped == 1
    assert [(r.abstract, r.title, r.source) for r in parsed.records] == [
        ("First abstract.", "", f"{tmp_path}/mine.txt:3"),
        ("Third abstract.", "Third", f"{tmp_path}/mine.txt:7"),
    ]


def test_a_short_csv_row_of_blanks_is_still_a_record_without_an_abstract(tmp_path):
    (tmp_path / "p.csv").write_text("id,title,abstract\nA,T,An abstract.\n  \n")
    parsed = parse_file(tmp_path / "p.csv")
    assert (len(parsed.records), parsed.skipped) == (1, 1)


def test_a_big_csv_field_reaches_the_abstract_check(tmp_path):
    """The csv module's own limit (128 KiB) must not be what refuses it."""
    (tmp_path / "p.csv").write_text("id,abstract\nA," + "y" * 200_000 + "\n")
    with pytest.raises(
        CorpusError, match=r"p.csv:2: abstract is 200,000 characters, longer than the limit"
    ):
        parse_file(tmp_path / "p.csv")
