"""Corpus files as `Record`s: ids, labels, fields under their common aliases, and the formats (seed
text files, JSONL, JSON, CSV and their `.gz` forms): `iter_records`, `parse_file`, `expand_paths`.

A file is checked through before anything is written (a malformed line stops it with `file:line:
what is wrong`); records are streamed, so a file can be read twice without being held; every read
is bounded (`rag.index.reading`); and every text field is cleaned of control characters and terminal
escapes (`rag.text.clean_field`), so nothing printed from the store can drive a terminal.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rag.errors import CorpusError
from rag.index.adopt import chroma_rows, is_chroma_source
from rag.index.reading import (
    DEFAULT_LIMITS,
    ReadLimits,
    RecordBudget,
    line_limit_error,
    open_text,
    text_lines,
)
from rag.text import clean_field, is_blank, normalize_text

SEED_METADATA_FILE = "seed_metadata.jsonl"
SUPPORTED_SUFFIXES = (
    ".txt",
    ".jsonl",
    ".json",
    ".csv",
    ".jsonl.gz",
    ".json.gz",
    ".csv.gz",
    ".txt.gz",
)

# Real abstracts are under 5,000 characters; 20x that is a whole paper, a scrape gone wrong or a
# CSV field that swallowed the rest of its file through a stray quote, not an abstract.
MAX_ABSTRACT_CHARS = 100_000
# The csv module refuses fields over 128 KiB ("field larger than field limit") before the abstract
# check can say what is wrong. Records are bounded by ReadLimits.record_bytes as they are read
# instead.
_CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)

# Field aliases seen in real paper dumps (OpenReview, paperlists, ICML virtual site...).
FIELD_ALIASES: dict[str, tuple[str, ...]] = {
    "id": ("id", "paper_id", "openreview_id", "forum", "uid"),
    "title": ("title", "paper_title", "name"),
    "authors": ("authors", "author", "author_names", "authors_list"),
    "abstract": ("abstract", "summary", "paper_abstract", "text", "tldr_abstract"),
    "url": ("url", "openreview_url", "link", "pdf_url", "site", "paper_url"),
    "venue": ("venue", "conference", "conf", "booktitle", "source"),
    "year": ("year", "conf_year", "publication_year"),
}


@dataclass
class Paper:
    """A paper as the index knows it: its id and metadata (one row of the store's `papers`
    table)."""

    paper_id: str
    title: str = ""
    label: str = ""  # a few words of the abstract, shown when there is no title
    authors: list[str] = field(default_factory=list)
    url: str | None = None
    venue: str | None = None
    year: str | None = None

    @property
    def display_title(self) -> str:
        return self.title or self.label

    def paper(self) -> Paper:
        """The paper alone (a `Record` without its abstract)."""
        return Paper(
            self.paper_id,
            self.title,
            self.label,
            list(self.authors),
            self.url,
            self.venue,
            self.year,
        )


@dataclass
class Record(Paper):
    """One abstract as read from a file, with the paper it belongs to."""

    abstract: str = ""
    source: str = ""  # "file:line" it was read from, for messages about it


@dataclass
class ParsedFile:
    path: Path
    records: list[Record]
    skipped: int = 0  # records without an abstract


def content_id(title: str, abstract: str) -> str:
    """Contract fallback id: first 12 hex chars of sha1(normalized title + abstract)."""
    key = (normalize_text(title) + " " + normalize_text(abstract)).strip()
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:12]


_OPENREVIEW_ID = re.compile(r"openreview\.net/(?:forum|pdf)\?(?:[^#]*&)?id=([^&#\s]+)")


def openreview_id(url: str | None) -> str | None:
    # A pattern, not urlparse: real urls are messy and urlparse raises on some (e.g. "https://[x").
    m = _OPENREVIEW_ID.search(url or "")
    return m.group(1) if m else None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "", text.lower())


def paper_id_for(
    raw_id: str | None,
    url: str | None,
    venue: str | None,
    year: str | None,
    title: str,
    abstract: str,
    openreview_ids: bool,
) -> str:
    """The contract's id rule: OpenReview id > <venue>-<year>-<id> > content hash."""
    from_url = openreview_id(url)
    if from_url:
        return from_url
    if raw_id:
        if openreview_ids:
            return raw_id
        parts = [p for p in (_slug(venue or ""), _slug(str(year or ""))) if p]
        return "-".join(parts + [raw_id]) if parts else raw_id
    return content_id(title, abstract)


# Words that often start an abstract's method name but are not one.
_NOT_NAMES = {
    "we",
    "in",
    "the",
    "this",
    "our",
    "a",
    "an",
    "however",
    "to",
    "for",
    "large",
    "recent",
    "existing",
    "while",
    "despite",
    "although",
    "many",
    "ai",
    "ml",
    "llm",
    "llms",
    "it",
}


def derive_label(abstract: str) -> str:
    """A short readable label for a paper whose title is unknown.

    Prefer the method name the abstract introduces ("We propose AcmeNet, ..."), else the
    first words of the abstract.
    """
    m = re.search(
        r"\b(?i:we|this paper|this work)\s+(?i:propose|introduce|present|call)s?\s+"
        r"([A-Z][\w-]+)\s*[,(:]",
        abstract,
    ) or re.search(
        r"\b(?i:we|this paper|this work)\s+(?i:propose|introduce|present|develop|design|call)s?\s+"
        r"(?i:a|an|the)?\s*(?i:new|novel|simple)?\s*(?:[\w-]+\s+){0,6}?"
        r"\(?([A-Z][A-Za-z0-9]*[A-Z0-9][A-Za-z0-9-]*)\)?",
        abstract,
    )
    if m and m.group(1).lower() not in _NOT_NAMES:
        name = m.group(1)
        sentence_end = abstract.find(".", m.end())
        tail = abstract[m.end() : sentence_end if sentence_end != -1 else m.end() + 80]
        tail = tail.lstrip(" ,:").split(",")[0].strip()
        words = tail.split()[:8]
        return f"{name}: {' '.join(words)}" if words else name
    words = abstract.split()[:10]
    return " ".join(words) + ("..." if len(abstract.split()) > 10 else "")


def _field(row: dict, name: str):
    for alias in FIELD_ALIASES[name]:
        if alias in row and row[alias] not in (None, ""):
            return row[alias]
    return None


def _as_text(value, where: str, name: str, numbers: bool = True) -> str | None:
    """A text field; ids and years may also be numbers, titles and abstracts may not."""
    if value is None:
        return None
    if isinstance(value, str) or (
        numbers and isinstance(value, (int, float)) and not isinstance(value, bool)
    ):
        text = clean_field(_valid_unicode(str(value))).strip()
        return None if is_blank(text) else text  # only zero-width characters: as good as missing
    raise CorpusError(f"{where}: field '{name}' should be text, got {type(value).__name__}")


def _valid_unicode(text: str) -> str:
    # JSON may escape lone surrogates ("\ud800"), which no UTF-8 encoder accepts: mark them as
    # U+FFFD.
    return (
        text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
        if any("\ud800" <= c <= "\udfff" for c in text)
        else text
    )


def _as_authors(value, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = clean_field(_valid_unicode(value))
        sep = ";" if ";" in value else (" and " if " and " in value else ",")
        return [a.strip() for a in value.split(sep) if not is_blank(a)]
    if isinstance(value, list):
        out: list[str] = []
        for a in value:
            if isinstance(a, dict):
                a = a.get("name") or " ".join(str(v) for v in a.values() if isinstance(v, str))
            if isinstance(a, list):  # a nested list of names
                out.extend(clean_field(_valid_unicode(x)).strip() for x in a if isinstance(x, str))
            elif isinstance(a, str):
                out.append(clean_field(_valid_unicode(a)).strip())
            elif a is not None:
                raise CorpusError(
                    f"{where}: field 'authors' holds a {type(a).__name__}; use names as text"
                )
        return [a for a in out if not is_blank(a)]
    raise CorpusError(
        f"{where}: field 'authors' should be a list or text, got {type(value).__name__}"
    )


def record_from_row(row: dict, where: str, openreview_ids: bool) -> Record | None:
    """Map one JSON/CSV row (any common aliases) to a Record; None when it has no abstract."""
    abstract = _as_text(_field(row, "abstract"), where, "abstract", numbers=False)
    if not abstract:
        return None
    check_abstract_length(" ".join(abstract.split()), where)
    title = _as_text(_field(row, "title"), where, "title", numbers=False) or ""
    url = _as_text(_field(row, "url"), where, "url")
    venue = _as_text(_field(row, "venue"), where, "venue")
    year = _as_text(_field(row, "year"), where, "year")
    raw_id = _as_text(_field(row, "id"), where, "id")
    pid = paper_id_for(raw_id, url, venue, year, title, abstract, openreview_ids)
    return Record(
        paper_id=pid,
        abstract=" ".join(abstract.split()),
        title=" ".join(title.split()),
        authors=_as_authors(_field(row, "authors"), where),
        url=url,
        venue=venue,
        year=year,
        label="" if title else derive_label(abstract),
        source=where,
    )


def check_abstract_length(abstract: str, where: str) -> None:
    """Refuse an over-long abstract like any other malformed record: the file stops, naming it."""
    if len(abstract) > MAX_ABSTRACT_CHARS:
        raise CorpusError(
            f"{where}: abstract is {len(abstract):,} characters, longer than the limit"
            f" {MAX_ABSTRACT_CHARS:,}; check that the field holds an abstract (not a whole paper or"
            " text swallowed by a stray quote), then shorten it or remove that record"
        )


def _looks_openreview(rows: list[dict]) -> bool:
    """A file whose urls point at OpenReview carries OpenReview ids in its `id` field."""
    urls = [str(_field(r, "url") or "") for r in rows[:200]]
    return any("openreview.net" in u for u in urls)


def _json_error(exc: Exception) -> str:
    """What is wrong, as a whole phrase with its column ("Unterminated string starting at" alone
    stops mid-phrase: the json module puts the position in a separate field)."""
    if isinstance(exc, json.JSONDecodeError):
        msg = exc.msg[0].lower() + exc.msg[1:]
        return f"{msg.removesuffix(' at')} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    # int() refuses over 4,300 digits: "Exceeds the limit (4300 digits) for integer string
    # conversion: value has 5001 digits; use sys.set_int_max_str_digits() to increase the limit"
    # (that fix is ours)
    return str(exc).split(";")[0]


def _json_document_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    """A `.json` file: an array of records, one record, or an object holding a list of records
    (as OpenReview API dumps do: {"notes": [...]})."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # bad JSON, a number too long, nesting too deep
        line = f":{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise CorpusError(
            f"{path}{line}: invalid JSON: {_json_error(exc)}; fix the file and run the ingest again"
        ) from None
    if isinstance(data, dict):
        lists = [
            v
            for v in data.values()
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)
        ]
        data = (
            lists[0]
            if len(lists) == 1 and not any(a in data for a in FIELD_ALIASES["abstract"])
            else [data]
        )
    if not isinstance(data, list):
        raise CorpusError(f"{path}: expected a JSON array of records, got {type(data).__name__}")
    rows = []
    for i, obj in enumerate(data, 1):
        if not isinstance(obj, dict):
            raise CorpusError(f"{path}: item {i} is not an object")
        rows.append((i, obj))
    return rows


def _jsonl_rows(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, dict]]:
    for lineno, line in text_lines(path, limits, skip_blank=True):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:  # bad JSON, a number too long, nesting too deep
            raise CorpusError(
                f"{path}:{lineno}: invalid JSON: {_json_error(exc)}; fix or remove that line"
            ) from None
        if not isinstance(obj, dict):
            raise CorpusError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def _csv_rows(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, dict]]:
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:  # process-wide; only ever raised
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    budget = RecordBudget()
    lines = text_lines(path, limits, budget)
    # strict: an unterminated quote is an error, not a field that swallows the rest of the file (its
    # size is bounded by the record budget while it is read).
    reader = csv.reader((line for _, line in lines), strict=True)
    try:
        fieldnames = next(reader, None)
        while fieldnames == []:  # blank lines before the header
            budget.reset()
            fieldnames = next(reader, None)
    except csv.Error as exc:
        raise CorpusError(f"{path}:1: malformed CSV header ({exc})") from None
    if fieldnames is None:  # an empty file, or only blank lines: no records
        return
    if not fieldnames:
        raise CorpusError(f"{path}: empty CSV; it needs a header row with at least 'abstract'")
    header = [h.strip().lower() for h in fieldnames]
    if not any(a in header for a in FIELD_ALIASES["abstract"]):
        raise CorpusError(
            f"{path}:1: CSV header has no 'abstract' column (found: {', '.join(header)})"
        )
    # Line numbers come from the budget, not reader.line_num: a run of blank lines reaches the
    # reader as one (see text_lines).
    budget.reset()
    try:
        for fields in reader:
            lineno = budget.first
            budget.reset()
            if not fields:  # a blank line
                continue
            if len(fields) > len(header):
                raise CorpusError(f"{path}:{lineno}: more fields than the header has")
            # A short row is misaligned (a missing comma, an unquoted line break): its values may
            # sit under the wrong columns. One of only blanks is a blank line, skipped as before.
            if len(fields) < len(header) and not all(is_blank(f) for f in fields):
                raise CorpusError(
                    f"{path}:{lineno}: malformed row: {len(fields)} columns, header has"
                    f" {len(header)}; check for a missing comma or an unquoted line break, or"
                    " remove that line"
                )
            yield lineno, dict(zip(header, fields))
    except csv.Error as exc:
        raise CorpusError(f"{path}:{budget.first}: malformed CSV ({exc})") from None


def _records_of(path: Path, rows: Iterable[tuple[int, dict]]) -> Iterator[Record | None]:
    """Records of rows, one at a time (None for a row without an abstract); the first 200 rows say
    whether ids are OpenReview's."""
    it = iter(rows)
    head = list(itertools.islice(it, 200))
    openreview_ids = _looks_openreview([r for _, r in head])
    for lineno, row in itertools.chain(head, it):
        yield record_from_row(row, f"{path}:{lineno}", openreview_ids)


_SEED_LINE_FIX = (
    'each line needs "seed_file" (a .txt file in the same directory) and "index" (the '
    "abstract's paragraph number in that file, from 1); fix or remove that line"
)


def load_seed_metadata(
    directory: Path, limits: ReadLimits = DEFAULT_LIMITS
) -> dict[tuple[str, int], dict]:
    """Titles, authors and urls of a seed directory's abstracts, keyed by (seed file, paragraph
    number).

    Read whole before any seed file is: a bad line stops the ingest naming the file, the line and
    the fix, and nothing is written.
    """
    meta_path = directory / SEED_METADATA_FILE
    if not meta_path.exists():
        return {}
    text = open_text(meta_path, limits)
    out = {}
    # Split on newlines only, as parse_jsonl does: a title may hold U+2028.
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        where = f"{meta_path}:{lineno}"
        if len(line) > limits.record_bytes:
            raise line_limit_error(meta_path, lineno, limits, "line")
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise CorpusError(
                f"{where}: invalid JSON: {_json_error(exc)}; fix or remove that line"
            ) from None
        if not isinstance(row, dict):
            raise CorpusError(
                f"{where}: expected a JSON object, got {type(row).__name__}; {_SEED_LINE_FIX}"
            )
        missing = [f"'{key}'" for key in ("seed_file", "index") if row.get(key) in (None, "")]
        if missing:
            raise CorpusError(f"{where}: missing {' and '.join(missing)}; {_SEED_LINE_FIX}")
        index = row["index"]
        if isinstance(index, str) and index.strip().isdigit():
            index = int(index)
        if (
            not isinstance(row["seed_file"], str)
            or isinstance(index, bool)
            or not isinstance(index, int)
        ):
            raise CorpusError(
                f"{where}: 'seed_file' should be a file name and 'index' a whole number; "
                f"{_SEED_LINE_FIX}"
            )
        out[(row["seed_file"], index)] = {
            "title": _as_text(row.get("title"), where, "title", numbers=False) or "",
            "authors": _as_authors(row.get("authors"), where),
            "openreview_url": _as_text(row.get("openreview_url"), where, "openreview_url"),
            "icml_url": _as_text(row.get("icml_url"), where, "icml_url"),
        }
    return out


def _paragraphs(lines: list[str], first_lineno: int) -> list[tuple[int, str]]:
    """(line number, text) of each paragraph: runs of lines that are not blank."""
    out: list[tuple[int, str]] = []
    start, current = first_lineno, list[str]()
    for lineno, line in enumerate([*lines, ""], first_lineno):
        if line.strip():
            if not current:
                start = lineno
            current.append(line)
        elif current:
            out.append((start, "\n".join(current)))
            current = []
    return out


def parse_seed_text(path: Path, text: str, limits: ReadLimits = DEFAULT_LIMITS) -> ParsedFile:
    """Seed format: a header line naming the collection, then one abstract per paragraph."""
    metadata = load_seed_metadata(path.parent, limits)
    lines = text.splitlines()
    venue = clean_field(lines[0]).strip() if lines else None
    records, skipped = [], 0
    # Paragraph numbers count every paragraph, an invisible one too: the metadata's index is
    # positional.
    for index, (lineno, paragraph) in enumerate(_paragraphs(lines[1:], 2), 1):
        abstract = " ".join(clean_field(paragraph).split())
        if is_blank(abstract):
            skipped += 1
            continue
        where = f"{path}:{lineno}"
        check_abstract_length(abstract, where)
        meta = metadata.get((path.name, index), {})
        title = meta.get("title") or ""
        url = meta.get("openreview_url") or meta.get("icml_url") or None
        pid = openreview_id(meta.get("openreview_url")) or content_id(title, abstract)
        records.append(
            Record(
                paper_id=pid,
                abstract=abstract,
                title=title,
                authors=list(meta.get("authors") or []),
                url=url,
                venue=venue,
                label="" if title else derive_label(abstract),
                source=where,
            )
        )
    return ParsedFile(path, records, skipped)


def iter_records(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> Iterator[Record | None]:
    """The records of one corpus file, by its suffix, one at a time (None for a record without an
    abstract); raises CorpusError naming the file (and line) where it is malformed or over `limits`.
    JSONL and CSV are read a line (a record) at a time; a JSON document and a seed text file are
    read whole, up to `limits.document_bytes`; a Chroma directory's collection whole, as documents
    (rag/index/adopt.py)."""
    if is_chroma_source(path):  # another app's Chroma collection (rag/index/adopt.py)
        yield from _records_of(path, chroma_rows(path))
        return
    name = path.name.lower()
    if not name.endswith(SUPPORTED_SUFFIXES):
        raise CorpusError(
            f"{path}: unsupported file type; use .txt (seed format), .jsonl, .json or .csv"
            " (optionally .gz)"
        )
    base = name[:-3] if name.endswith(".gz") else name
    if base.endswith(".jsonl"):
        yield from _records_of(path, _jsonl_rows(path, limits))
        return
    if base.endswith(".csv"):
        yield from _records_of(path, _csv_rows(path, limits))
        return
    text = open_text(path, limits)
    if not text.strip():
        return
    if base.endswith(".json"):
        yield from _records_of(path, _json_document_rows(path, text))
    else:
        parsed = parse_seed_text(path, text, limits)
        yield from parsed.records
        yield from [None] * parsed.skipped


def parse_file(path: Path, limits: ReadLimits = DEFAULT_LIMITS) -> ParsedFile:
    """Parse one corpus file whole (see `iter_records`)."""
    records, skipped = [], 0
    for rec in iter_records(path, limits):
        if rec is None:
            skipped += 1
        else:
            records.append(rec)
    return ParsedFile(path, records, skipped)


def expand_paths(paths: list[Path]) -> list[Path]:
    """Files to ingest: each file as given, each directory's supported files (sorted); a Chroma
    directory (or DIR/COLLECTION) as one source."""
    out: list[Path] = []
    for p in paths:
        if is_chroma_source(p):  # a Chroma directory, or DIR/COLLECTION: read as one source
            out.append(p)
        elif p.is_dir():
            out.extend(
                sorted(
                    f
                    for f in p.iterdir()
                    if f.is_file()
                    and f.name.lower().endswith(SUPPORTED_SUFFIXES)
                    and f.name != SEED_METADATA_FILE
                )
            )
        else:
            out.append(p)
    return out
