"""Property-based tests (hypothesis) of the corpus parsers and the citation parser.

Corpus (`rag.index.corpus.parse_file` on generated files):
- whatever the bytes or the JSON in a file, parsing raises nothing but `CorpusError`;
- well-formed JSONL and CSV files keep every record's abstract (whitespace normalised) and skip
  exactly the records without one; the same records give the same ids in JSONL and CSV, in any
  order, and on every re-parse.

Citations (`parse_markers`, `renumber`, `MarkerRewriter`):
- the streamed rewrite equals the whole-text rewrite for any text and any split into pieces;
- after `renumber`, every [n] in the text is in 1..m, m is the number of cited sources, each of 1..m
  is used, and no marker pointing at no source survives; renumbering is idempotent.

Runs are bounded (max_examples 100-200, no deadline): the file runs in well under 20 s.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import tempfile
from pathlib import Path

import pytest

# skipped locally without hypothesis; CI must have it (the `test` extra)
if not os.environ.get("CI"):
    pytest.importorskip("hypothesis", reason="pip install hypothesis")
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rag.answer.citations import MarkerRewriter, parse_markers, renumber
from rag.errors import CorpusError
from rag.index.corpus import parse_file
from rag.models import Source
from rag.text import clean_field, is_blank

BOUNDED = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SUFFIXES = [".jsonl", ".json", ".csv", ".txt", ".jsonl.gz", ".csv.gz", ".json.gz"]


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="rag-props-") as tmp:
        yield Path(tmp)


def _write(workdir: Path, suffix: str, data: bytes) -> Path:
    path = workdir / f"f{random.getrandbits(48):012x}{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    return path


# ============================================================== corpus: strategies

# Text with the characters real dumps carry and parsers trip on: quotes, separators, line and
# paragraph separators, NEL, BOM, no-break space, tabs, CR.
TRICKY = [
    '"',
    "'",
    ",",
    ";",
    " and ",
    "\\",
    "\t",
    "\r",
    "\n",
    "\r\n",
    "\u2028",
    "\u2029",
    "\x85",
    "\xa0",
    "\ufeff",
    "\x1c",
    "\x1e",
    "[1]",
    "{",
    "}",
    "é",
    "数",
    "🙂",
    "openreview.net/forum?id=",
    "  ",
]
text = st.lists(
    st.one_of(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
        st.sampled_from(TRICKY),
    ),
    max_size=12,
).map("".join)
maybe_text = st.one_of(st.none(), st.just(""), text)
ident = st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True))
url = st.one_of(
    st.none(),
    st.just(""),
    ident.map(lambda i: f"https://openreview.net/forum?id={i}" if i else ""),
    st.just("https://example.org/paper"),
)
row = st.fixed_dictionaries(
    {
        "id": ident,
        "title": maybe_text,
        "authors": maybe_text,
        "abstract": maybe_text,
        "url": url,
        "venue": st.one_of(st.none(), st.sampled_from(["ICML", "NeurIPS 2024", "iclr"])),
        "year": st.one_of(st.none(), st.integers(1990, 2030)),
    }
)
COLUMNS = ["id", "title", "authors", "abstract", "url", "venue", "year"]

json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), text),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(COLUMNS + ["summary", "x"]), children, max_size=5),
    ),
    max_leaves=12,
)


def _jsonl(rows: list[dict], ensure_ascii: bool) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=ensure_ascii) + "\n" for r in rows).encode("utf-8")


def _csv(rows: list[dict], lineterminator: str) -> bytes:
    out = io.StringIO(newline="")
    # csv.writer quotes only what its line terminator holds: with "\n", quote everything (a bare
    # "\r" would be written unquoted, an invalid CSV)
    writer = csv.writer(
        out,
        lineterminator=lineterminator,
        quoting=csv.QUOTE_MINIMAL if lineterminator == "\r\n" else csv.QUOTE_ALL,
    )
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow(["" if r[c] is None else str(r[c]) for c in COLUMNS])
    return out.getvalue().encode("utf-8")


def _expected_abstracts(rows: list[dict]) -> list[str]:
    cleaned = [" ".join(clean_field(r["abstract"]).split()) for r in rows if r["abstract"]]
    return [a for a in cleaned if not is_blank(a)]


def _parse(path: Path):
    try:
        return parse_file(path)
    except CorpusError:
        raise
    except Exception as exc:  # the property: nothing but CorpusError escapes
        raise AssertionError(f"parse_file raised {type(exc).__name__}: {exc}") from exc


# ============================================================== corpus: properties


@BOUNDED
@given(data=st.binary(max_size=400), suffix=st.sampled_from(SUFFIXES))
def test_any_bytes_raise_nothing_but_corpus_error(workdir, data, suffix):
    try:
        _parse(_write(workdir, suffix, data))
    except CorpusError as exc:
        assert str(exc) and "\n" not in str(exc)


@BOUNDED
@given(values=st.lists(json_value, max_size=6), as_array=st.booleans(), gz=st.booleans())
@example(
    values=[{"abstract": "x", "url": "https://[openreview.net/forum?id=1"}],
    as_array=False,
    gz=False,
)
@example(values=[{"abstract": "x", "id": 10**5000}], as_array=False, gz=False)
@example(values=[{"abstract": "broken \ud800 emoji"}], as_array=False, gz=False)
def test_any_json_records_raise_nothing_but_corpus_error(workdir, values, as_array, gz):
    import sys

    limit = sys.get_int_max_str_digits()
    # json.dumps itself refuses huge ints under the default limit; the file must still hold one
    try:
        sys.set_int_max_str_digits(0)
        body = (
            json.dumps(values) if as_array else "".join(json.dumps(v) + "\n" for v in values)
        ).encode("utf-8", "surrogatepass")
    finally:
        sys.set_int_max_str_digits(limit)
    suffix = (".json" if as_array else ".jsonl") + (".gz" if gz else "")
    try:
        _parse(_write(workdir, suffix, body))
    except CorpusError as exc:
        assert str(exc) and "\n" not in str(exc)


@pytest.mark.parametrize(
    "name, body",
    [
        ("deep.json", "[" * 50_000),
        ("deep.jsonl", '{"abstract": ' + "[" * 50_000 + "\n"),
        ("bigint.jsonl", '{"abstract": "x", "id": 1' + "0" * 5000 + "}\n"),
        ("ipv6.csv", "abstract,url\nan abstract,http://openreview.net]/forum?id=2\n"),
        ("surrogate.jsonl", '{"abstract": "half an emoji \\ud83d"}\n'),
    ],
)
def test_hostile_json_and_urls_raise_nothing_but_corpus_error(workdir, name, body):
    path = workdir / name
    path.write_text(body, encoding="utf-8")
    try:
        parsed = _parse(path)
    except CorpusError:
        return
    for rec in parsed.records:  # accepted: then every field is storable text
        rec.abstract.encode("utf-8")
        rec.paper_id.encode("utf-8")


@BOUNDED
@given(
    data=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=300),
    suffix=st.sampled_from([".csv", ".jsonl", ".txt"]),
)
def test_any_text_raises_nothing_but_corpus_error(workdir, data, suffix):
    try:
        _parse(_write(workdir, suffix, data.encode("utf-8")))
    except CorpusError as exc:
        assert str(exc) and "\n" not in str(exc)


@BOUNDED
@given(rows=st.lists(row, max_size=8), ensure_ascii=st.booleans(), gz=st.booleans())
@example(
    rows=[
        {
            "id": "a",
            "title": None,
            "authors": None,
            "abstract": "one\u2028two",
            "url": None,
            "venue": None,
            "year": None,
        }
    ],
    ensure_ascii=False,
    gz=False,
)
def test_jsonl_keeps_every_abstract(workdir, rows, ensure_ascii, gz):
    path = _write(workdir, ".jsonl.gz" if gz else ".jsonl", _jsonl(rows, ensure_ascii))
    parsed = _parse(path)
    assert [r.abstract for r in parsed.records] == _expected_abstracts(rows)
    assert parsed.skipped == len(rows) - len(parsed.records)
    # re-parse
    assert [r.paper_id for r in _parse(path).records] == [r.paper_id for r in parsed.records]


@BOUNDED
@given(rows=st.lists(row, max_size=8), lineterminator=st.sampled_from(["\n", "\r\n"]))
def test_csv_keeps_every_abstract(workdir, rows, lineterminator):
    path = _write(workdir, ".csv", _csv(rows, lineterminator))
    parsed = _parse(path)
    assert [r.abstract for r in parsed.records] == _expected_abstracts(rows)
    assert parsed.skipped == len(rows) - len(parsed.records)
    assert [r.paper_id for r in _parse(path).records] == [r.paper_id for r in parsed.records]


@BOUNDED
@given(rows=st.lists(row, min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_ids_are_the_same_in_jsonl_and_csv_and_in_any_order(workdir, rows, seed):
    def keyed(path):
        return sorted((r.paper_id, r.abstract, r.title) for r in _parse(path).records)

    as_jsonl = keyed(_write(workdir, ".jsonl", _jsonl(rows, ensure_ascii=True)))
    as_csv = keyed(_write(workdir, ".csv", _csv(rows, "\n")))
    shuffled = rows[:]
    random.Random(seed).shuffle(shuffled)
    assert (
        as_jsonl == as_csv == keyed(_write(workdir, ".jsonl", _jsonl(shuffled, ensure_ascii=True)))
    )


# ============================================================== citations: strategies

PIECES = [
    "[",
    "]",
    "1]",
    "[1",
    "[9]",
    "[1]",
    "[2]",
    "[3]",
    "[2, 1]",
    "[1-3]",
    "[3-1]",
    "[1][2]",
    "[Source 2]",
    "[src 1; 3]",
    "[0]",
    "[9]",
    "[12]",
    "[99, 1]",
    "[1-40]",
    "1",
    "2",
    "3",
    "7",
    ", ",
    ",",
    "-",
    "–",
    ";",
    " ",
    "  ",
    "\t",
    "\n",
    ". ",
    "Source ",
    "ref ",
    "the claim",
    "A finding.",
    "x",
    "(1)",
    "[a]",
    "[]",
    "[ 2 ]",
]
answer_text = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=5)), max_size=30).map(
    "".join
)


def _sources(n: int) -> list[Source]:
    return [
        Source(n=i + 1, paper_id=f"P{i + 1}", title=f"T{i + 1}", score=0.5, passage="p")
        for i in range(n)
    ]


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces, last = [], 0
    for c in points + [len(text)]:
        pieces.append(text[last:c])
        last = c
    return pieces


def _whole(text: str, n: int) -> MarkerRewriter:
    rw = MarkerRewriter(n)
    rw.whole = rw.feed(text) + rw.close()
    return rw


# ============================================================== citations: properties


@settings(max_examples=200, deadline=None)
@given(text=answer_text, n=st.integers(0, 6), cuts=st.lists(st.integers(0, 10_000), max_size=12))
@example(text="Claim [1" + " " * 45 + "] done.", n=3, cuts=[50])
@example(text="Claim [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13] done.", n=13, cuts=[48])
@example(text="\\[1]", n=1, cuts=[1])  # an escaped bracket whose backslash ends one piece
# an unclosed bracket too far back to open a marker, then one that does, cut inside it
@example(
    text="[[[[[[[1]1][2, 1][99, 1][99, 1][99, 1]  Source A finding.00000[2, 1]", n=0, cuts=[63]
)
def test_streamed_rewrite_equals_the_whole_text_rewrite(text, n, cuts):
    whole = _whole(text, n)
    rw = MarkerRewriter(n)
    streamed = "".join(rw.feed(p) for p in _split(text, cuts)) + rw.close()
    assert streamed == whole.whole
    assert rw.order == whole.order and rw.invalid == whole.invalid
    assert renumber(text, _sources(n))[0] == whole.whole.strip()


@settings(max_examples=200, deadline=None)
@given(text=answer_text, n=st.integers(0, 6))
@example(text="[[9]1]", n=0)
@example(text="[[9]2]", n=3)
def test_renumbered_markers_are_1_to_m_and_none_invalid_survives(text, n):
    new_text, sources, invalid = renumber(text, _sources(n))
    m = sum(s.cited for s in sources)
    markers = parse_markers(new_text)
    assert all(1 <= k <= m for k in markers), (new_text, markers, m)
    assert set(markers) == set(range(1, m + 1)), (new_text, markers, m)
    # cited sources first, numbered 1..m; then the rest; the same papers as before
    assert [s.n for s in sources] == list(range(1, n + 1))
    assert all(s.cited for s in sources[:m]) and not any(s.cited for s in sources[m:])
    assert sorted(s.paper_id for s in sources) == sorted(s.paper_id for s in _sources(n))
    assert all(k > n or k < 1 for k in invalid)
    # idempotent: a renumbered answer is already numbered in order of first use
    again, again_sources, again_invalid = renumber(new_text, sources)
    assert again == new_text and again_invalid == []
    assert [(s.n, s.paper_id) for s in again_sources] == [(s.n, s.paper_id) for s in sources]


@settings(max_examples=150, deadline=None)
@given(
    numbers=st.lists(st.integers(1, 50), min_size=1, max_size=5),
    style=st.sampled_from(["[{}]", "[Source {}]", "[ {} ]", "[src {}]"]),
    sep=st.sampled_from([", ", ",", "; ", " ;"]),
    filler=st.text(st.characters(exclude_characters="[]"), max_size=20),
)
def test_parse_markers_reads_back_what_was_written(numbers, style, sep, filler):
    grouped = style.format(sep.join(map(str, numbers)))
    adjacent = "".join(f"[{k}]" for k in numbers)
    assert parse_markers(f"{filler} {grouped} {filler}") == numbers
    assert parse_markers(f"a {adjacent} b") == numbers
