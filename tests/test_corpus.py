"""Corpus parsing: seed files, JSONL/CSV/.gz, ids, labels and bad input."""

from __future__ import annotations

import gzip
import json

import pytest

from rag.corpus import content_id, derive_label, expand_paths, parse_file
from rag.errors import CorpusError
from tests.conftest import REPO, SHARED, write_jsonl


def test_seed_corpus_has_76_papers_with_openreview_ids_and_titles(seed_titles):
    records = [r for f in expand_paths([REPO / "corpus"]) for r in parse_file(f).records]
    assert len(records) == 76
    assert {r.paper_id for r in records} == set(seed_titles)
    assert all(r.title == seed_titles[r.paper_id] for r in records)
    assert all(r.authors and r.url for r in records)


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


@pytest.mark.parametrize("abstract, label", [
    ("We propose NAVI, a segment-centric pretraining framework for tables.", "NAVI"),
    ("In this work we introduce FedARC (federated adaptive routing) to couple models.", "FedARC"),
    ("Large models are everywhere and nobody knows why they work so well in practice at all.", "Large models"),
])
def test_label_names_the_method_or_starts_the_abstract(abstract, label):
    assert derive_label(abstract).startswith(label)


def test_jsonl_aliases_ids_and_skips(tmp_path, small_corpus):
    parsed = parse_file(small_corpus)
    assert parsed.skipped == 1
    ids = [r.paper_id for r in parsed.records]
    assert ids[:3] == ["AAAAAAAAA1", "BBBBBBBBB2", "AAAAAAAAA1"]
    assert len(ids[3]) == 12 and ids[3] == content_id("Graph Transformers for Molecules", parsed.records[3].abstract)
    assert parsed.records[1].authors == ["Alan Turing", "Grace Hopper"]
    rows = [{"id": "42", "conference": "NeurIPS", "year": 2019, "title": "T", "summary": "An abstract."}]
    rec = parse_file(write_jsonl(tmp_path / "alias.jsonl", rows)).records[0]
    assert (rec.paper_id, rec.venue, rec.year, rec.abstract) == ("neurips-2019-42", "NeurIPS", "2019", "An abstract.")


def test_csv_and_gzip(tmp_path):
    csv_text = "title,authors,abstract,url\nA CSV paper,\"Ann; Bob\",It studies CSV parsing.,https://openreview.net/forum?id=CSV123\n"
    (tmp_path / "p.csv").write_text(csv_text)
    rec = parse_file(tmp_path / "p.csv").records[0]
    assert (rec.paper_id, rec.authors) == ("CSV123", ["Ann", "Bob"])
    gz = tmp_path / "p.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(json.dumps({"id": "X1", "title": "T", "abstract": "A b c."}) + "\n")
    assert parse_file(gz).records[0].abstract == "A b c."


def test_real_icml_file_parses_with_null_ids():
    parsed = parse_file(SHARED / "data/icml2026_main.jsonl.gz")
    assert len(parsed.records) == 5862
    hashed = [r for r in parsed.records if len(r.paper_id) == 12 and r.url in (None, "")]
    assert len(hashed) == 74


@pytest.mark.parametrize("name, content, message", [
    ("bad.jsonl", b'{"abstract": "ok"}\n{"abstract": broken\n', r"bad.jsonl:2: invalid JSON"),
    ("list.jsonl", b'[1, 2]\n', r"list.jsonl:1: expected a JSON object"),
    ("types.jsonl", b'{"abstract": {"x": 1}}\n', r"types.jsonl:1: field 'abstract' should be text"),
    ("latin1.jsonl", '{"abstract": "caf\u00e9"}\n'.encode("latin-1"), r"latin1.jsonl: not UTF-8"),
    ("binary.txt", b"\x00\x01\x02binary", r"binary.txt: looks like a binary file"),
    ("trunc.jsonl.gz", gzip.compress(b'{"abstract": "x"}\n' * 50)[:-20], r"trunc.jsonl.gz: not a valid gzip"),
    ("nocol.csv", b"title,url\nA,B\n", r"nocol.csv:1: CSV header has no 'abstract'"),
    ("paper.pdf", b"%PDF", r"paper.pdf: unsupported file type"),
])
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
