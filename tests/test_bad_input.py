"""Bad input at every entry point: the CLI (`rag` in a subprocess), the Python API (`RAG.ask`,
`search`, `stream`, `chat`), the UI's chat function (through the running Gradio app) and ingest.

Each bad input gives a one-line error naming the problem (CLI: exit 1 or 2, one stderr line, no
traceback; API: a `RagError`; UI: a one-line chat reply or Gradio's one-line validation error), or
is handled sensibly: control characters cleaned, a huge k an error naming the limit, k=100 capped to
the corpus, duplicate ids kept as one paper with both texts. A failed ingest never leaves a
half-written index (papers, chunks, vectors and the keyword index unchanged). The seed store is only
read; ingests go to copies of a small tmp store.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from rag import RAG
from rag.errors import CorpusError, InputError, RagError
from tests.cli_batch import run_cli_batch
from tests.conftest import run_cli, write_jsonl
from tests.servers import free_port

Q = "How does Palimpsa relate to Mamba2?"
PALIMPSA = "wKMV7mXjUr"
# no NUL: argv cannot carry one
C0 = "How does\x01 Palimpsa\x1b[31m relate\x07 to\r\nMamba2?\x7f\x0c"
C1 = "How does Palimpsa\x9b31m relate to\x90 Mamba2?\x85\x9f"  # C1 controls: \x9b is the 8-bit CSI


def control_chars(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) == "Cc"]


# ============================================================== questions, k and mode, every entry
# point


@dataclass
class Outcome:
    """What an entry point did with one input, normalised."""

    ok: bool
    error: str = ""  # the one-line message, when it refused
    lines: int = 0  # lines in the error message
    question: str | None = None  # the question as the entry point understood it (echoed back)
    shown: str | None = None  # the question as shown back to the user (UI chat)
    results: int | None = None  # papers returned
    ignored: bool = False  # nothing happened (UI: a blank question is not sent)
    traceback: bool = False


def _error(exc: Exception) -> Outcome:
    msg = str(exc)
    return Outcome(
        False, error=msg, lines=len(msg.strip().splitlines()), traceback="Traceback" in msg
    )


def api_ask(rag, q, **kw):
    try:
        a = rag.ask(q, **kw)
    except RagError as exc:
        return _error(exc)
    return Outcome(True, question=a.question, results=len(a.sources))


def api_search(rag, q, **kw):
    try:
        return Outcome(True, results=len(rag.search(q, **kw)))
    except RagError as exc:
        return _error(exc)


def api_stream(rag, q, **kw):
    try:
        stream = rag.stream(q, **kw)
        pieces = list(stream)
    except RagError as exc:
        return _error(exc)
    assert all(isinstance(p, str) for p in pieces)
    return Outcome(True, question=stream.answer.question, results=len(stream.answer.sources))


def api_chat(rag, q, **kw):
    try:
        a = rag.chat(
            q,
            history=[
                {"role": "user", "content": "Tell me about attention models."},
                {"role": "assistant", "content": "..."},
            ],
            **kw,
        )
    except RagError as exc:
        return _error(exc)
    return Outcome(True, question=a.question, results=len(a.sources))


def _cli_args(command, rag, q, k=None, mode=None):
    args = [command, q, "--json", "--store", str(rag.settings.store_dir)]
    if k is not None:
        args += ["--k", str(k)]
    if mode is not None:
        args += ["--mode", mode]
    return args


def _cli_outcome(command, proc):
    if proc.returncode == 0:
        data = json.loads(proc.stdout)
        if command == "ask":
            return Outcome(True, question=data["question"], results=len(data["sources"]))
        return Outcome(True, results=len(data["results"]))
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr)
    return Outcome(
        False,
        error=proc.stderr.strip(),
        lines=len(proc.stderr.strip().splitlines()),
        traceback="Traceback" in proc.stderr + proc.stdout,
    )


def _cli(command, rag, q, k=None, mode=None):
    return _cli_outcome(command, run_cli(*_cli_args(command, rag, q, k, mode), timeout=120))


def cli_ask(rag, q, **kw):
    return _cli("ask", rag, q, **kw)


def cli_search(rag, q, **kw):
    return _cli("search", rag, q, **kw)


def _chat_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def ui_respond(ui, q, k=None, mode=None):
    """The chat's submit endpoint, as the page calls it (a fresh session per call; `ui` is the
    module's one gradio_client.Client: closing a client costs a second)."""
    from gradio_client.exceptions import AppError

    ui.reset_session()
    try:
        _, chat, panel, _, _ = ui.predict(
            q, [], 5 if k is None else k, mode or "hybrid", api_name="/respond"
        )
    except AppError as exc:  # Gradio's own validation (slider bounds, radio choices)
        return _error(exc)
    if not isinstance(chat, list):  # a blank question is not sent: nothing changes
        return Outcome(True, ignored=True)
    assert [m["role"] for m in chat] == ["user", "assistant"], chat
    reply = _chat_text(chat[1])
    if reply.startswith("⚠️"):
        return Outcome(
            False, error=reply, lines=len(reply.strip().splitlines()), shown=_chat_text(chat[0])
        )
    assert "▌" not in reply and ("References" in reply or "don&#x27;t answer" in reply), reply
    return Outcome(
        True, shown=_chat_text(chat[0]), question=panel, results=panel.count('class="src-card')
    )


ENTRIES = {
    "api.ask": api_ask,
    "api.search": api_search,
    "api.stream": api_stream,
    "api.chat": api_chat,
    "cli.ask": cli_ask,
    "cli.search": cli_search,
    "ui.respond": ui_respond,
}
CLI_ENTRIES = {"cli.ask", "cli.search"}

# (case id, question, k, mode, expectation): "error:<text the message must contain>", "ok",
# "capped", "clean" (answered, with control characters gone), "ignored"; per-entry overrides in
# OVERRIDES.
CASES = [
    ("empty", "", None, None, "error:the question is empty"),
    ("whitespace", " \t\r\n\x0b\x0c ", None, None, "error:the question is empty"),
    ("100kB", ("why " * 25_000).strip() + "?", None, None, "error:characters long"),
    ("c0-control-chars", C0, None, None, "clean"),
    ("c1-control-chars", C1, None, None, "clean"),
    ("k=0", Q, 0, None, "error:between 1 and 100"),
    ("k<0", Q, -7, None, "error:between 1 and 100"),
    ("k=10**9", Q, 10**9, None, "error:between 1 and 100"),
    ("k=100", Q, 100, None, "capped"),
    ("unknown-mode", Q, None, "semantic", "error:semantic"),
]
OVERRIDES = {
    # The page never sends a blank question (and the Gradio slider bounds k to 1..20).
    ("ui.respond", "empty"): "ignored",
    ("ui.respond", "whitespace"): "ignored",
    ("ui.respond", "k=0"): "error:less than minimum value 1",
    ("ui.respond", "k<0"): "error:less than minimum value 1",
    ("ui.respond", "k=10**9"): "error:greater than maximum value 20",
    ("ui.respond", "k=100"): "error:greater than maximum value 20",
}


@pytest.fixture(scope="module")
def cli_runs(seed_rag):
    """Every CASE through `rag ask` and `rag search`, run once for the module in one fresh process
    (tests/cli_batch.py: the real `rag.cli.main` per command, each with its own exit code and
    output), not a process per case: the 20 cold starts were most of this file's time. A cold `rag`
    process per entry is kept by test_a_cold_rag_process_refuses_bad_input_in_one_line below."""
    commands = {
        (entry, name): _cli_args(entry.split(".")[1], seed_rag, question, k, mode)
        for entry in sorted(CLI_ENTRIES)
        for name, question, k, mode, _ in CASES
    }
    return dict(zip(commands, run_cli_batch(*commands.values(), timeout=600)))


@pytest.fixture(scope="module")
def ui(seed_rag):
    from gradio_client import Client

    from rag.ui.app import launch

    port = free_port()
    demo = launch(seed_rag, host="127.0.0.1", port=port, block=False)
    client = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
    yield client
    client.close()
    demo.close()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_bad_question_k_or_mode(request, entry, case, seed_rag):
    name, question, k, mode, expect = case
    expect = OVERRIDES.get((entry, name), expect)
    target = request.getfixturevalue("ui") if entry == "ui.respond" else seed_rag
    kwargs = {key: v for key, v in (("k", k), ("mode", mode)) if v is not None}
    if entry in CLI_ENTRIES:
        out = _cli_outcome(entry.split(".")[1], request.getfixturevalue("cli_runs")[(entry, name)])
    else:
        out = ENTRIES[entry](target, question, **kwargs)
    assert not out.traceback, out.error
    if expect.startswith("error:"):
        assert not out.ok, f"{entry} accepted {name}"
        assert out.lines == 1, f"{entry}: error is {out.lines} lines: {out.error!r}"
        assert expect[6:].lower() in out.error.lower(), out.error
        if entry in CLI_ENTRIES:
            assert out.error.startswith("rag"), out.error
    elif expect == "ignored":
        assert out.ignored, out
    else:
        assert out.ok, f"{entry} refused {name}: {out.error}"
        if expect == "capped":
            assert out.results == 76, out.results  # every seed paper once, not 100 of anything
        if expect == "clean":
            if out.question is not None:
                assert not control_chars(out.question), (
                    f"{entry} kept {control_chars(out.question)}"
                )
                assert "Palimpsa" in out.question and "Mamba2" in out.question
            # the UI echoes the question back into the chat (line breaks may stay)
            if out.shown is not None:
                shown = [c for c in control_chars(out.shown) if c not in "\t\r\n"]
                assert not shown, f"{entry} shows {shown} in the chat"


@pytest.mark.parametrize(
    "entry, case",
    [
        ("cli.ask", "c1-control-chars"),
        ("cli.ask", "k=10**9"),
        ("cli.search", "c0-control-chars"),
        ("cli.search", "unknown-mode"),
    ],
)
def test_a_cold_rag_process_does_what_the_batched_command_did(entry, case, cli_runs, seed_rag):
    """The matrix above runs its CLI cases through `rag.cli.main` in one process; here a few run as
    the `rag` executable, one cold process each, and must give the same outcome."""
    name, question, k, mode, _ = next(c for c in CASES if c[0] == case)
    cold = ENTRIES[entry](
        seed_rag, question, **{key: v for key, v in (("k", k), ("mode", mode)) if v is not None}
    )
    assert cold == _cli_outcome(entry.split(".")[1], cli_runs[(entry, name)])


def test_control_characters_do_not_change_the_answer(seed_rag):
    plain = seed_rag.ask(Q)
    for noisy in (
        "How\x01 does\x07 Palimpsa\r\nrelate to\tMamba2?\x7f",
        "How\x00 does Palimpsa relate to Mamba2?\x00",
    ):
        answer = seed_rag.ask(noisy)
        assert answer.question == Q
        assert [s.paper_id for s in answer.sources] == [s.paper_id for s in plain.sources]
        assert answer.sources[0].paper_id == PALIMPSA and answer.answer == plain.answer
    # an ANSI colour sequence loses its ESC; the rest is harmless text
    assert seed_rag.ask(C0).sources[0].paper_id == PALIMPSA


@pytest.mark.parametrize(
    "k, message",
    [(2.5, "whole number"), ("5", "whole number"), (True, "whole number"), (None, None)],
)
def test_k_must_be_a_whole_number_in_the_api(seed_rag, k, message):
    if message is None:
        assert len(seed_rag.search(Q, k=k)) == seed_rag.settings.top_k  # None: the default
        return
    for call in (
        lambda: seed_rag.search(Q, k=k),
        lambda: seed_rag.ask(Q, k=k),
        lambda: list(seed_rag.stream(Q, k=k)),
    ):
        with pytest.raises(InputError, match=message):
            call()


@pytest.mark.parametrize("question", [None, b"How does Palimpsa relate to Mamba2?", 42, ["q"]])
def test_a_question_that_is_not_text_is_refused(seed_rag, question):
    with pytest.raises(InputError, match="must be text"):
        seed_rag.ask(question)


def test_chat_tolerates_a_malformed_history(seed_rag):
    history = [
        None,
        5,
        "text",
        {"role": "user"},
        {"content": "no role"},
        {"role": "user", "content": None},
        {"role": "user", "content": 12},
        {"role": "assistant", "content": ["x"]},
    ]
    answer = seed_rag.chat(Q, history=history)
    assert answer.sources[0].paper_id == PALIMPSA


# ============================================================== corpus files

GOOD = {
    "id": "GOOD000001",
    "title": "Sparse Routing",
    "authors": ["Ada Lovelace"],
    "abstract": (
        "A routing method for sparse mixtures of experts balances load without auxiliary losses."
    ),
    "url": "https://openreview.net/forum?id=GOOD000001",
}
OTHER = {
    "id": "OTHER00001",
    "title": "Protein Folding",
    "authors": ["Alan Turing"],
    "abstract": "A diffusion model predicts protein structures from sequences.",
    "url": "https://openreview.net/forum?id=OTHER00001",
}


def _jsonl(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


_FULL_GZ = gzip.compress(
    _jsonl(*[{**OTHER, "id": f"GZ{i:08d}", "url": ""} for i in range(300)]), mtime=0
)

# (case id, file name, content, expectation): "error:<text>" - a CorpusError naming the file and the
# problem, nothing written; "empty" - accepted, nothing written, the report says no records were
# read; "safe" - a CorpusError naming the file, or read and indexed; never another exception.
CORPUS_CASES = [
    ("empty-jsonl", "empty.jsonl", b"", "empty"),
    ("empty-csv", "empty.csv", b"", "empty"),
    ("empty-json", "empty.json", b"", "empty"),
    ("blank-lines", "blank.jsonl", b"\n  \n\t\n", "empty"),
    ("empty-gzip", "empty.jsonl.gz", gzip.compress(b"", mtime=0), "empty"),
    ("binary", "binary.jsonl", bytes(range(256)) * 16, "error:looks like a binary file"),
    ("binary-nul", "nul.csv", b"abstract\n\x00\x00\x01\x02\x03", "error:binary"),
    (
        "latin-1-jsonl",
        "latin1.jsonl",
        json.dumps({**GOOD, "abstract": "Café résumé naïve"}, ensure_ascii=False).encode("latin-1"),
        "error:not UTF-8",
    ),
    (
        "cp1252-csv",
        "cp1252.csv",
        "id,title,abstract\nC1,Caf\u00e9,R\u00e9sum\u00e9 \u2014 a paper\n".encode("cp1252"),
        "error:not UTF-8",
    ),
    ("truncated-gzip", "trunc.jsonl.gz", _FULL_GZ[: len(_FULL_GZ) // 2], "error:gzip"),
    ("not-gzip", "plain.jsonl.gz", _jsonl(GOOD), "error:gzip"),
    (
        "abstract-list",
        "t.jsonl",
        _jsonl(GOOD, {**OTHER, "abstract": ["a", "b"]}),
        "error:'abstract' should be text",
    ),
    (
        "abstract-bool",
        "t.jsonl",
        _jsonl({**OTHER, "abstract": True}),
        "error:'abstract' should be text",
    ),
    (
        "abstract-number",
        "t.jsonl",
        _jsonl({**OTHER, "abstract": 12345}),
        "error:'abstract' should be text",
    ),
    (
        "title-object",
        "t.jsonl",
        _jsonl({**OTHER, "title": {"en": "x"}}),
        "error:'title' should be text",
    ),
    ("id-list", "t.jsonl", _jsonl({**OTHER, "id": ["a"]}), "error:'id' should be text"),
    ("authors-number", "t.jsonl", _jsonl({**OTHER, "authors": 42}), "error:'authors' should be"),
    (
        "year-object",
        "t.jsonl",
        _jsonl({**OTHER, "year": {"y": 2026}}),
        "error:'year' should be text",
    ),
    ("line-is-a-list", "t.jsonl", _jsonl(GOOD) + b"[1, 2]\n", "error:expected a JSON object"),
    ("line-is-a-number", "t.jsonl", b"42\n", "error:expected a JSON object"),
    ("broken-json-line", "t.jsonl", _jsonl(GOOD) + b'{"abstract": \n', "error::2: invalid JSON"),
    (
        "json-array-with-scalars",
        "t.json",
        json.dumps([GOOD, 3]).encode(),
        "error:item 2 is not an object",
    ),
    (
        "csv-no-abstract-column",
        "t.csv",
        b"id,title,authors\nC1,A title,Someone\n",
        "error:no 'abstract' column",
    ),
    (
        "csv-no-header",
        "t.csv",
        b"C4,Some title,An abstract that has no header row\n",
        "error:no 'abstract' column",
    ),
    (
        "csv-extra-fields",
        "t.csv",
        b"id,title,abstract\nC3,T,An abstract,extra\n",
        "error:more fields",
    ),
    (
        "csv-unterminated-quote",
        "t.csv",
        b'id,title,abstract\nC5,"unterminated,An abstract here\n',
        "error:t.csv:2",
    ),
    ("unsupported-type", "paper.pdf", b"%PDF-1.4\n", "error:unsupported file type"),
    # Hostile but possible: refused with a CorpusError naming the file, or read - never a crash.
    ("deeply-nested-json", "deep.json", b"[" * 50_000, "safe"),
    (
        "huge-integer-id",
        "t.jsonl",
        b'{"abstract": "An abstract.", "id": 1' + b"0" * 5000 + b"}\n",
        "safe",
    ),
    (
        "malformed-url",
        "t.csv",
        b"abstract,url\nAn abstract.,http://openreview.net]/forum?id=X\n",
        "safe",
    ),
    (
        "lone-surrogate-escape",
        "t.jsonl",
        b'{"abstract": "Half an emoji \\ud83d in a scraped abstract."}\n',
        "safe",
    ),
]


@dataclass
class StoreState:
    papers: int
    chunks: int
    vectors: int
    keyword: str

    @classmethod
    def of(cls, store: Path) -> StoreState:
        rag = RAG(store_dir=store, llm="none")
        kw = store / "keyword.json"  # names the segments, which are never rewritten
        digest = hashlib.sha1(kw.read_bytes()).hexdigest() if kw.exists() else ""
        return cls(
            rag.store.paper_count(), rag.store.chunk_count(), rag.store.collection().count(), digest
        )


@pytest.fixture(scope="module")
def base_store(tmp_path_factory) -> Path:
    """A small store (two papers), copied for each ingest test so cases never share a store."""
    tmp = tmp_path_factory.mktemp("bad_input_base")
    store = tmp / "store"
    report = RAG(store_dir=store, llm="none").ingest(
        [write_jsonl(tmp / "base.jsonl", [GOOD, OTHER])], include_corpus=False
    )
    assert report.new_papers == 2
    return store


@pytest.fixture
def store(base_store, tmp_path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(base_store, copy)
    return copy


@pytest.mark.parametrize(
    "name, filename, content, expect", CORPUS_CASES, ids=[c[0] for c in CORPUS_CASES]
)
def test_bad_corpus_file_api(store, tmp_path, name, filename, content, expect):
    path = tmp_path / filename
    path.write_bytes(content)
    before = StoreState.of(store)
    rag = RAG(store_dir=store, llm="none")
    if expect == "safe":
        try:
            report = rag.ingest([path], include_corpus=False)
        except CorpusError as exc:
            assert len(str(exc).splitlines()) == 1 and str(path) in str(exc), exc
        except Exception as exc:
            pytest.fail(f"ingest crashed with {type(exc).__name__}: {exc}"[:300])
        else:
            assert StoreState.of(store).papers == before.papers + report.new_papers
            return
    elif expect.startswith("error:"):
        with pytest.raises(CorpusError) as info:
            rag.ingest([path], include_corpus=False)
        msg = str(info.value)
        assert len(msg.splitlines()) == 1 and str(path) in msg and expect[6:] in msg, msg
    else:
        report = rag.ingest([path], include_corpus=False)
        assert report.records == 0 and report.new_chunks == 0, report
        assert "0 records" in report.summary()
    assert StoreState.of(store) == before


CLI_CORPUS_CASES = [
    "empty-jsonl",
    "binary",
    "latin-1-jsonl",
    "truncated-gzip",
    "abstract-list",
    "csv-no-abstract-column",
    "csv-unterminated-quote",
    "unsupported-type",
    "deeply-nested-json",
    "malformed-url",
]


@pytest.mark.parametrize(
    "case", [c for c in CORPUS_CASES if c[0] in CLI_CORPUS_CASES], ids=lambda c: c[0]
)
def test_bad_corpus_file_cli(store, tmp_path, case):
    name, filename, content, expect = case
    path = tmp_path / filename
    path.write_bytes(content)
    before = StoreState.of(store)
    proc = run_cli("ingest", str(path), "--store", str(store), timeout=120)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-600:]
    if expect == "safe":
        assert proc.returncode in (0, 1) and len(proc.stderr.strip().splitlines()) <= 1, proc.stderr
        if proc.returncode == 0:
            return
    elif expect.startswith("error:"):
        assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rag: error: ") and expect[6:] in lines[0], (
            proc.stderr
        )
    else:
        assert proc.returncode == 0, proc.stderr
        assert "0 records" in proc.stdout
    assert StoreState.of(store) == before


def test_one_bad_file_among_good_ones_writes_nothing(store, tmp_path):
    good = write_jsonl(
        tmp_path / "new.jsonl",
        [
            {
                **OTHER,
                "id": "NEW0000001",
                "url": "",
                "abstract": "Graph transformers predict molecular properties.",
            }
        ],
    )
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"id,title\nX,no abstract column\n")
    before = StoreState.of(store)
    with pytest.raises(CorpusError, match="bad.csv"):
        RAG(store_dir=store, llm="none").ingest([good, bad], include_corpus=False)
    assert StoreState.of(store) == before
    proc = run_cli("ingest", str(good), str(bad), "--store", str(store), timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert StoreState.of(store) == before


def test_duplicate_ids_with_different_text_are_one_paper_with_both_texts(store, tmp_path):
    first = "Graph neural networks predict molecular properties from atom-level message passing."
    second = "Protein language models trained on evolutionary sequences improve contact prediction."
    rows = [
        {
            "id": "DUP0000001",
            "title": "Twice",
            "abstract": first,
            "url": "https://openreview.net/forum?id=DUP0000001",
        },
        {
            "id": "DUP0000001",
            "title": "Twice",
            "abstract": second,
            "url": "https://openreview.net/forum?id=DUP0000001",
        },
        {
            "id": "DUP0000001",
            "title": "Twice",
            "abstract": first,
            "url": "https://openreview.net/forum?id=DUP0000001",
        },
    ]
    before = StoreState.of(store)
    rag = RAG(store_dir=store, llm="none")
    report = rag.ingest([write_jsonl(tmp_path / "dups.jsonl", rows)], include_corpus=False)
    after = StoreState.of(store)
    assert report.new_papers == 1 and after.papers == before.papers + 1
    assert after.chunks == before.chunks + 2 and after.vectors == before.vectors + 2
    for text, words in (
        (first, "graph neural networks molecular message passing"),
        (second, "protein language models evolutionary contact prediction"),
    ):
        hits = rag.search(words, k=5, mode="bm25")
        assert [h.paper_id for h in hits].count("DUP0000001") == 1  # each paper listed once
        assert text in next(h.passage for h in hits if h.paper_id == "DUP0000001")
    again = rag.ingest([write_jsonl(tmp_path / "dups2.jsonl", rows[::-1])], include_corpus=False)
    assert again.wrote_nothing and StoreState.of(store) == after


def test_a_json_file_holding_one_object_or_a_wrapped_list_is_read_or_refused_clearly(
    store, tmp_path
):
    """A `.json` file is one JSON document: a pretty-printed object (or {"notes": [...]}, the shape
    of OpenReview API dumps) must not be read line by line ("line 1: invalid JSON" on valid JSON)
    nor skipped silently as one record without an abstract."""
    rag = RAG(store_dir=store, llm="none")
    problems = []
    for name, doc in (
        ("pretty.json", json.dumps({**OTHER, "id": "PRETTY0001", "url": ""}, indent=2)),
        ("wrapped.json", json.dumps({"notes": [{**OTHER, "id": "WRAP000001", "url": ""}]})),
    ):
        path = tmp_path / name
        path.write_text(doc)
        try:
            report = rag.ingest([path], include_corpus=False)
        except CorpusError as exc:
            if "invalid JSON" in str(exc):
                problems.append(f"{name}: valid JSON reported as invalid: {exc}")
            continue
        if report.new_papers != 1:
            problems.append(f"{name}: {report.summary()}")
    assert not problems, "\n".join(problems)


def test_authors_that_are_not_names_are_not_kept_as_text(tmp_path):
    from rag.index.corpus import parse_file

    path = write_jsonl(
        tmp_path / "a.jsonl",
        [{**OTHER, "authors": [None, "Ada Lovelace", "", {"name": "Alan Turing"}]}],
    )
    assert parse_file(path).records[0].authors == ["Ada Lovelace", "Alan Turing"]


def test_papers_of_none_is_a_clear_error(seed_rag):
    """Issue 31, item 7: `RAG.papers(None)` raised `TypeError: 'NoneType' object is not
    iterable`."""
    for bad in (None, 42, b"wKMV7mXjUr"):
        with pytest.raises(InputError, match=r"papers\(\) takes a paper id or a list of them"):
            seed_rag.papers(bad)
    assert [p.paper_id for p in seed_rag.papers((PALIMPSA,))] == [PALIMPSA]


@pytest.mark.parametrize("variable", ["OPENAI_BASE_URL", "RAG_EMBED_BASE_URL"])
def test_a_scheme_less_endpoint_url_never_prints_its_password(seed_store, variable):
    """Issue 31, item 7: `OPENAI_BASE_URL=user:pass@host` was echoed whole by `rag doctor` and `rag
    ask`."""
    for command in (["doctor"], ["ask", Q], ["stats"]):
        proc = run_cli(
            *command,
            "--store",
            str(seed_store),
            env={variable: "user:s3cretpw@llm.example:8080/v1"},
        )
        assert "s3cretpw" not in proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert "needs http:// or https:// in front (got ***@llm.example:8080/v1)" in lines[0]
    proc = run_cli(
        "doctor", "--store", str(seed_store), env={"RAG_CHROMA_URL": "user:s3cretpw@127.0.0.1:9"}
    )
    assert "s3cretpw" not in proc.stdout + proc.stderr and "***@127.0.0.1:9" in proc.stdout
