"""The `rag` command: parses arguments and renders; the engine does the work.

Exit codes: 0 done, 1 user or runtime error (one line on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

from rag.text import printable


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints the whole usage)
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _k(text: str) -> int:
    from rag.config import check_k
    from rag.errors import InputError

    try:
        return check_k(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, got {value}")
    return value


def _mode(text: str) -> str:
    modes = _modes(text)
    if len(modes) != 1:
        raise argparse.ArgumentTypeError(f"expected one retrieval mode, got {text!r}")
    return modes[0]


def _modes(text: str) -> list[str]:
    from rag.config import check_mode
    from rag.errors import InputError

    try:
        modes = [check_mode(m.strip()) for m in text.split(",") if m.strip()]
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not modes:
        raise argparse.ArgumentTypeError(f"expected one or more retrieval modes, got {text!r}")
    return modes


EXAMPLES = """\
examples:
  rag ask "How does Palimpsa relate to Mamba2?"   answer from the bundled papers, with citations
  rag search "state space models" --k 10          the 10 best-matching papers, each with its passage
  rag cite wKMV7mXjUr --format bibtex             a paper id from `rag search`, as BibTeX
  rag ingest my_papers.jsonl --store ~/papers     index your own papers in a store of their own
  rag ask "Which methods use LoRA?" --store ~/papers --json
  rag ui                                          the browser chat on http://127.0.0.1:7860
  rag serve                                       an OpenAI-compatible API at 127.0.0.1:8000/v1

`rag COMMAND --help` describes a command and its options."""

INGEST_EXAMPLES = """\
examples:
  rag ingest                                      the bundled papers, into the default store
  rag ingest my_papers.jsonl --store ~/papers     ~/papers holds only what you ingest into it
  rag ingest more.csv --store ~/papers            adds to it; abstracts already there are skipped
  rag ingest --rebuild my_papers.jsonl --store ~/papers   empties ~/papers, then indexes the file"""


def build_parser() -> argparse.ArgumentParser:
    from rag import __version__

    parser = _Parser(
        prog="rag",
        description="Ask questions about ML paper abstracts; answers cite their papers.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )

    def common(p):
        p.add_argument(
            "--store",
            type=Path,
            metavar="DIR",
            help="store directory (default: RAG_STORE_DIR, else the checkout's store/, "
            "else the per-user data directory)",
        )
        p.add_argument(
            "--collection",
            metavar="NAME",
            help=(
                "Chroma collection (default: RAG_COLLECTION, else the store's own; matters with"
                " RAG_CHROMA_URL, where replicas that serve one corpus share a name)"
            ),
        )
        return p

    p = common(
        sub.add_parser(
            "ingest",
            help="add corpus files (.txt seed format, .jsonl, .csv, .gz) to the index",
            epilog=INGEST_EXAMPLES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    p.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="a file (.txt seed format, .jsonl, .csv, each optionally .gz) or a directory of them",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help=(
            "empty the store first, then ingest PATHs (what it held is not read again: pass its"
            " files again); the bundled corpus/ goes in too with no PATHs, into the default store,"
            " or with --with-corpus, never into a --store DIR otherwise"
        ),
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help="with --rebuild on a Chroma server: rebuild a collection other stores write into too "
        "(their vectors go with it)",
    )
    corpus = p.add_mutually_exclusive_group()
    corpus.add_argument("--no-corpus", action="store_true", help="never add the bundled corpus/")
    corpus.add_argument(
        "--with-corpus",
        action="store_true",
        help="add the bundled corpus/ too (it goes in by itself only with no PATHs, or into "
        "the default store while it is empty)",
    )

    for name, helptext in (
        ("ask", "answer a question with citations"),
        ("search", "list the papers that match"),
    ):
        p = common(sub.add_parser(name, help=helptext))
        if name == "ask":
            p.add_argument(
                "question", help='the question, quoted: "How does Palimpsa relate to Mamba2?"'
            )
        else:
            p.add_argument(
                "query",
                help="what to look for, quoted: keywords, a method or author name, or a "
                'description ("debiasing CLIP attention heads")',
            )
        p.add_argument("--k", type=_k, help="number of papers to retrieve (default 5)")
        p.add_argument(
            "--mode",
            type=_mode,
            help="retrieval mode: bm25, dense, hybrid (default), hybrid-rrf, hybrid-convex",
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "ask":
            p.add_argument(
                "--no-llm",
                action="store_true",
                help="extractive answer even when an LLM is configured",
            )
            p.add_argument(
                "--bibtex",
                action="store_true",
                help="print the cited papers as BibTeX after the answer "
                "(text output only; with --json, pass the cited paper_ids to `rag cite`)",
            )

    from rag.cite import CITE_FORMATS

    p = common(
        sub.add_parser("cite", help="print indexed papers as BibTeX, RIS or a markdown list")
    )
    p.add_argument(
        "paper_ids", nargs="+", metavar="PAPER_ID", help="paper ids (as `rag search` shows them)"
    )
    p.add_argument(
        "--format", choices=CITE_FORMATS, default="bibtex", help="bibtex (default), ris or markdown"
    )

    p = common(sub.add_parser("stats", help="papers, chunks, embedding model and store location"))
    p.add_argument("--json", action="store_true", help="print JSON")

    p = common(sub.add_parser("eval", help="retrieval and answer metrics over a question file"))
    p.add_argument(
        "questions", type=Path, help="JSONL file: {id, question, gold, kind, key_facts?} per line"
    )
    p.add_argument(
        "--mode",
        action="append",
        type=_modes,
        default=[],
        help=(
            "retrieval mode(s) to compare: repeat or comma-separate (default: the configured mode)"
        ),
    )
    p.add_argument(
        "--k",
        type=_k,
        help="papers given to the answerer (default: the configured top_k, RAG_TOP_K, else 5); "
        "retrieval uses 10",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-answers", action="store_true", help="retrieval metrics only")
    p.add_argument(
        "--ci",
        action="store_true",
        help="add a 95%% interval to every figure (Wilson or bootstrap over the questions)",
    )
    p.add_argument(
        "--misses", action="store_true", help="list the questions each mode does not rank first"
    )
    p.add_argument(
        "--also-store",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help=(
            "evaluate this store too, as more columns (repeatable): each store is queried with the "
            "embedding model that built it, so embedders are compared side by side in one run"
        ),
    )
    p.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="RULE",
        help=(
            "turn an answer rule off (repeatable), to measure what it contributes: any rule of the"
            " table in docs/answers.md, by name (as RAG_RULES_OFF does)"
        ),
    )

    p = common(
        sub.add_parser(
            "doctor", help="check the configuration, store, embedding model and LLM endpoint"
        )
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    common(
        sub.add_parser(
            "repair",
            help="re-index a damaged store from what it still holds (keeps its papers)",
            description=(
                "Re-read every paper and abstract papers.sqlite still holds (a damaged header "
                "or pages too), index them again (chunks, vectors, keyword index) and keep the "
                "old files in STORE/damaged-<time>/. Papers that cannot be read are listed by "
                "id. Needs no corpus files."
            ),
        )
    )

    p = common(sub.add_parser("ui", help="start the browser chat"))
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, help="port (default 7860 or GRADIO_SERVER_PORT)")

    p = common(
        sub.add_parser(
            "serve", help="serve an OpenAI-compatible HTTP API (chat completions, search, papers)"
        )
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, help="port (default 8000 or RAG_API_PORT)")
    p.add_argument(
        "--allow-no-key",
        action="store_true",
        help="bind a non-loopback address without RAG_API_KEY (anyone who can reach it can use it)",
    )

    p = common(
        sub.add_parser(
            "map",
            help="write a map of the indexed papers (clusters; an answer's papers lit up) "
            "as one self-contained HTML file",
        )
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("map.html"),
        help="the HTML file to write (default map.html)",
    )
    p.add_argument(
        "--ask",
        metavar="QUESTION",
        help="answer this question and light up its cited and retrieved papers",
    )
    p.add_argument(
        "--no-llm",
        action="store_true",
        help="with --ask: extractive answer even when an LLM is configured",
    )
    p.add_argument(
        "--abstracts",
        action=argparse.BooleanOptionalAction,
        help="put the abstracts in the page (default: for maps of up to 20,000 papers)",
    )

    common(
        sub.add_parser(
            "mcp",
            help="serve the tools to an MCP client (Claude Desktop, an agent) over stdio",
            description="Serve search_papers, ask, get_paper and cite over MCP on stdin/stdout "
            "(stdout is the protocol; logs go to stderr).",
        )
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rag.errors import RagError

    try:
        return _run(args)
    except RagError as exc:
        print(f"rag: error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `rag stats | head -1`
        sys.stderr.close()
        return 0


def _run(args) -> int:
    from rag import RAG
    from rag.extras import require

    overrides: dict = {"store_dir": args.store} if args.store else {}
    if getattr(args, "collection", None):
        overrides["collection"] = args.collection
    rag = RAG(**overrides)
    if args.command == "ingest":
        include = True if args.with_corpus else False if args.no_corpus else None
        from rag import CollectionShared

        try:
            report = rag.ingest(
                args.paths,
                rebuild=args.rebuild,
                include_corpus=include,
                progress=True,
                shared=args.yes,
                cap_malloc_arenas=True,
            )
        except CollectionShared as exc:
            if not sys.stdin.isatty() or input(
                f"rag: {exc}.\nRebuild the shared collection? [y/N] "
            ).strip().lower() not in ("y", "yes"):
                raise
            report = rag.ingest(
                args.paths, rebuild=True, include_corpus=include, progress=True, shared=True
            )
        print(report.summary())
        after = rag.store.paper_count()
        tip = embedder_tip(
            rag.settings.embed_model, after - report.new_papers, after, str(rag.store.dir)
        )
        if tip:
            print(tip, file=sys.stderr)
        return 0
    if args.command == "stats":
        stats = rag.stats()
        if args.json:
            print(json.dumps(stats, indent=2))
        else:
            for key, value in stats.items():
                _print(f"{key}: {value}")
        _warn_degraded(rag)
        return 0
    if args.command == "doctor":
        return _doctor(rag, args)
    if args.command == "repair":
        print(rag.repair(progress=True))
        return 0
    if args.command == "cite":
        from rag.cite import format_citations

        _announce_build(rag)
        _print(format_citations(rag.papers(args.paper_ids), args.format), end="")
        return 0
    if args.command == "search":
        _announce_build(rag)
        sources = rag.search(args.query, k=args.k, mode=args.mode)
        if args.json:
            print(
                json.dumps(
                    {
                        "query": args.query,
                        "mode": args.mode or rag.settings.mode,
                        "results": [s.model_dump() for s in sources],
                    },
                    indent=2,
                )
            )
        else:
            from rag.latex import plain_prose

            if sources:
                _print(textwrap.fill(rag.order_legend(args.mode), width=100))

            for s in sources:
                _print(f"[{s.n}] {plain_prose(s.title)} ({s.paper_id})")
                _print(f"    {s.scores_label()}")
                if s.url:
                    _print(f"    {s.url}")
                _print(
                    textwrap.fill(
                        plain_prose(s.passage),
                        width=100,
                        initial_indent="    ",
                        subsequent_indent="    ",
                        max_lines=4,
                        placeholder=" …",
                    )
                )
        _warn_degraded(rag)
        return 0
    if args.command == "ask":
        _announce_build(rag)
        code = _ask(rag, args)
        _warn_degraded(rag)
        return code
    if args.command == "eval":
        return _eval(rag, args)
    if args.command == "ui":
        require("ui")
        from rag.net import check_port_free
        from rag.ui.app import launch

        host = args.host or rag.settings.ui_host
        port = args.port or rag.settings.ui_port
        check_port_free(host, port)
        launch(rag, host=host, port=port)
        return 0
    if args.command == "serve":
        require("serve")
        from rag.serve.http import serve

        _announce_build(rag)
        serve(rag, host=args.host, port=args.port, allow_no_key=args.allow_no_key)
        return 0
    if args.command == "map":
        require("map")
        return _map(rag, args)
    if args.command == "mcp":
        require("mcp")
        from rag.serve.mcp import run_stdio  # the mcp SDK loads here only: `rag --help` stays fast

        _announce_build(rag)  # stderr: stdout is the protocol
        run_stdio(rag)
        return 0
    return 2


class TerminalText:
    """An answer's text as the terminal shows it, piece by piece: LaTeX as Unicode text and no
    markdown emphasis (`\\emph{self-checking}`, `**F**unction` read "self-checking", "Function").
    Whole lines (a quote block, an extractive answer: a piece with a line break) go through
    `plain_prose`; a model's live words only lose their escapes (`95\\%` reads "95%"), a trailing
    backslash held for the next piece."""

    _ESCAPE = re.compile(r"\\([%&_#$])")

    def __init__(self) -> None:
        self._held = ""

    def feed(self, piece: str) -> str:
        from rag.latex import plain_prose

        text, self._held = self._held + piece, ""
        if text.endswith("\\") and not text.endswith("\\\\"):
            text, self._held = text[:-1], "\\"
        if "\n" in text:
            return "\n".join(plain_prose(line) for line in text.split("\n"))
        return self._ESCAPE.sub(r"\1", text)

    def close(self) -> str:
        held, self._held = self._held, ""
        return held


def _print(text: str = "", end: str = "\n") -> None:
    """Print text from the index or a model: a control character in a title or an answer could
    otherwise retitle the terminal, clear it or write to the clipboard (OSC 0/52, CSI 2J)."""
    print(printable(text), end=end, flush=True)


def _print_err(text: str) -> None:
    """A line on stderr holding text from the index or a server, made printable like `_print`."""
    print(" ".join(printable(text).split()), file=sys.stderr, flush=True)  # one line, always


def _announce_build(rag) -> None:
    if rag.needs_build:
        print(
            "rag: building the index of the bundled papers (once; later questions reuse it)…",
            file=sys.stderr,
        )


def _warn_degraded(rag) -> None:
    """What a catch-up with a Chroma server found (each once, when it happened), and why dense
    retrieval did not run: one line each on stderr."""
    done = rag.caught_up
    if done is not None and done.rebuilt:
        print(
            f"rag: note: collection {rag.store.collection_name!r} was replaced on the server"
            " (another store rebuilt it); this store's caches were rebuilt from it"
            f" ({done.abstracts:,} abstracts; the old ones are kept in {done.aside})",
            file=sys.stderr,
        )
    if done is not None:
        for line in done.warnings(rag.store.collection_name, f"rag repair --store {rag.store.dir}"):
            _print_err(f"rag: warning: {line}")
    if rag.store.vectors_unavailable:
        print(
            f"rag: warning: {rag.store.vectors_unavailable}; these results come from keyword"
            " retrieval only",
            file=sys.stderr,
        )


def _map(rag, args) -> int:
    from rag.errors import InputError

    out = args.out
    if out.is_dir():
        raise InputError(f"{out} is a directory; give --out a file name such as {out / 'map.html'}")
    if not out.parent.is_dir():
        raise InputError(
            f"the directory {out.parent} does not exist; create it or pick another --out"
        )
    _announce_build(rag)
    pmap = rag.paper_map(
        progress=lambda line: print(f"rag: map: {line}…", file=sys.stderr, flush=True)
    )
    answer = rag.ask(args.ask, llm=not args.no_llm) if args.ask else None
    page = rag.map_page(pmap, answer, abstracts=args.abstracts)
    try:
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {out} ({exc.strerror}); pick another --out") from None
    lit = (
        f"; lit up: {len(answer.cited_sources)} cited of {len(answer.sources)} retrieved papers"
        if answer
        else ""
    )
    print(f"wrote {out}: {len(pmap):,} papers in {len(pmap.labels)} clusters{lit}")
    return 0


def _doctor(rag, args) -> int:
    from dataclasses import asdict

    from rag.doctor import run_checks

    checks = run_checks(rag)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            _print(
                f"{c.status.upper():4s}  {c.name}: {c.detail}"
                + (f"\n      fix: {c.fix}" if c.fix and c.status != "ok" else "")
            )
    return 1 if any(c.status == "fail" for c in checks) else 0


def _ask(rag, args) -> int:
    from rag.markers import plain_text
    from rag.models import Reading, Writing

    if args.json and args.bibtex:
        print(
            "rag: error: --bibtex prints BibTeX after the text answer; with --json, pass the cited "
            "paper_ids to `rag cite`",
            file=sys.stderr,
        )
        return 2
    waiting: _Waiting | None = None
    show_wait = not args.json and sys.stderr.isatty()
    if show_wait:  # at once: on a busy machine finding the papers can take a second or more
        sys.stderr.write("rag: finding the papers…")
        sys.stderr.flush()
    stream = rag.stream(args.question, k=args.k, mode=args.mode, llm=not args.no_llm)
    terminal = TerminalText()
    try:
        for piece in stream:
            if isinstance(piece, Reading) and show_wait:
                show_wait = False
                waiting = _Waiting(piece)  # sources found; a local model takes seconds to read them
            elif isinstance(piece, Writing) and waiting is not None:
                waiting.writing(piece.tokens)
            elif not args.json and piece:
                if waiting is not None:
                    waiting.stop()
                    waiting = None
                elif show_wait:  # no model: the answer comes at once
                    show_wait = False
                    sys.stderr.write("\r\033[K")
                    sys.stderr.flush()
                _print(terminal.feed(plain_text(piece)), end="")  # checked text, never taken back
    finally:
        if waiting is not None:
            waiting.stop()
        elif show_wait:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
    answer = stream.answer
    if args.json:
        print(answer.to_json())
        return 0
    _print(terminal.close(), end="")
    print()
    # What the checks took out before the answer was shown (nothing shown is taken back).
    if answer.filtered:
        print(
            f"rag: note: left out {len(answer.filtered)} sentence(s) or link(s) that only an"
            " instruction planted in a source asked for",
            file=sys.stderr,
        )
    if answer.withdrawn is not None:
        why = (
            "nothing cited was left once those were left out"
            if answer.abstained_by == "filter"
            else "no citation of it is supported by the passage it cites"
        )
        print(f"rag: note: the model's answer was not shown: {why}", file=sys.stderr)
    if answer.error:
        shown = (
            "showing an extractive answer"
            if answer.mode == "extractive"
            else "the quotes shown stand; the model's synthesis is missing"
        )
        print(f"rag: warning: {answer.error}; {shown}", file=sys.stderr)
    if answer.removed_markers:
        marks = ", ".join(f"[{n}]" for n in answer.removed_markers)
        print(
            f"rag: warning: removed citation markers that match no source: {marks}", file=sys.stderr
        )
    _print_references(answer)
    if args.bibtex:
        _print_bibtex(rag, answer)
    return 0


class _Waiting:
    """What the terminal shows while the model works: the papers found (at once, on stderr: status,
    not the answer), then one status line updated every second on a thread (the answer's loop is
    blocked on the model): the reading with the engine's estimate and, past it, what it waits for;
    then the writing, whose answer shows once checked."""

    def __init__(self, reading) -> None:
        import threading
        import time

        self._reading, self._start, self._time = reading, time.monotonic(), time.monotonic
        self._tokens: int | None = None
        self._done = threading.Event()
        papers = reading.papers
        titles = "".join(f"  {' '.join(printable(p.title).split())}\n" for p in papers)
        sys.stderr.write(
            f"\r\033[Krag: found {len(papers)} paper{'s' if len(papers) != 1 else ''}:\n{titles}"
        )
        self._write()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def writing(self, tokens: int) -> None:
        self._tokens = tokens
        self._write()

    def _write(self) -> None:
        elapsed = self._time() - self._start
        n, expected = self._reading.sources, self._reading.seconds
        head = f"rag: the model is reading the {n} papers"
        if self._tokens is not None:
            line = (
                f"rag: the model is writing ({self._tokens} token{'s' if self._tokens != 1 else ''}"
                f" so far, {elapsed:.0f} s); the"
                " answer shows once checked"
            )
        elif expected is None:
            line = f"{head}… {elapsed:.0f} s"
        elif elapsed < expected:
            line = f"{head}: about {expected - elapsed:.0f} s left"
        else:
            line = (
                f"rag: the model is still reading the {n} papers ({elapsed:.0f} s, about"
                f" {expected:.0f} s expected{_busy()}); its first word comes after the reading"
            )
        sys.stderr.write(f"\r\033[K{line}")
        sys.stderr.flush()

    def _tick(self) -> None:
        while not self._done.wait(1.0):
            self._write()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def _busy() -> str:
    """ ", the machine is busy: load 3.5 on 2 cores" when other work holds the cores, else ""."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    return f"; the machine is busy: load {load:.1f} on {cores} cores" if load > cores / 2 else ""


def _print_bibtex(rag, answer) -> None:
    from rag.cite import cited_paper_ids, format_citations

    ids = cited_paper_ids(answer)
    if not ids:
        print("rag: the answer cites no paper; no BibTeX to print", file=sys.stderr)
        return
    print()
    _print(format_citations(rag.papers(ids), "bibtex"), end="")


def _eval(rag, args) -> int:
    from rag.evaluation import evaluate, load_questions, render_markdown

    questions = load_questions(args.questions)
    modes = list(dict.fromkeys(m for group in args.mode for m in group)) or [rag.settings.mode]
    stores = [rag.store.dir.resolve(), *(path.resolve() for path in args.also_store)]
    if len(set(stores)) < len(stores):
        from rag.errors import InputError

        raise InputError(
            "--also-store names a store twice (or the --store itself); give each store once"
        )
    engines = [rag, *(_other_store(path) for path in args.also_store)]
    turned_off: list[str] = []
    if args.without:
        from rag.evaluation.without import without

        for engine in engines:
            engine.settings, turned_off = without(engine.settings, args.without)
    # k None: settings' top_k
    reports = [
        evaluate(
            engine,
            questions,
            modes,
            k=args.k,
            answers=not args.no_answers,
            progress=sys.stderr.isatty(),
            ci=args.ci,
        )
        for engine in engines
    ]
    if len(engines) > 1:
        from rag.evaluation import side_by_side

        # A column is named by the store's embedding model, and by its directory when two share a
        # model.
        labels = [engine.settings.embed_model for engine in engines]
        labels = [
            f"{label} ({engine.store.dir})" if labels.count(label) > 1 else label
            for label, engine in zip(labels, engines)
        ]
        report = side_by_side(dict(zip(labels, reports)))
    else:
        report = reports[0]
    if report.missing_gold:
        listed = "; ".join(
            f"{q}: {', '.join(ids)}" for q, ids in list(report.missing_gold.items())[:5]
        )
        more = f"; and {len(report.missing_gold) - 5} more" if len(report.missing_gold) > 5 else ""
        print(
            f"rag: warning: {args.questions}: gold paper ids not in the index count as misses"
            f" ({listed}{more})",
            file=sys.stderr,
        )
    off = {"without": args.without, "rules_off": turned_off} if args.without else {}
    if args.json:
        print(json.dumps({"file": str(args.questions), **off, **report.to_dict()}, indent=2))
    else:
        if off:
            _print(f"Rules off: {', '.join(args.without)} (RAG_RULES_OFF={','.join(turned_off)})\n")
        _print(render_markdown(report, source=str(args.questions), misses=args.misses), end="")
    return 0


# From here on, questions in people's own words find their paper first more often with the model
# trained on ML papers (docs/retrieval.md: 5,871 papers); a store of the model it was trained from
# is re-indexed in minutes.
ML_TIP_PAPERS = (1_000, 20_000)


def embedder_tip(model: str, before: int, after: int, store: str = "DIR") -> str | None:
    """The line `rag ingest` prints when it takes a store of all-MiniLM-L6-v2 (the default before
    minilm-l6-ml-v1) past ML_TIP_PAPERS[0] papers (once: an ingest that starts above it says
    nothing), within the range where re-indexing takes minutes."""
    from rag.config import MINILM_EMBED_MODEL, ML_EMBED_MODEL

    low, high = ML_TIP_PAPERS
    if model != MINILM_EMBED_MODEL or not before < low <= after <= high:
        return None
    return (
        f"rag: tip: among {after:,} papers, questions in people's own words find their paper more"
        f" often with {ML_EMBED_MODEL}, the default for new stores (this one was built with"
        f" {MINILM_EMBED_MODEL}): RAG_EMBED_MODEL={ML_EMBED_MODEL} rag repair --store {store}"
        " re-indexes it; compare first with `rag eval QUESTIONS.jsonl --store DIR --also-store"
        " NEW-DIR` on a copy built with it (docs/retrieval.md)"
    )


def _other_store(path: Path):
    """An engine on another store for `rag eval --also-store` (settings from the environment, as the
    first's)."""
    from rag import RAG
    from rag.errors import InputError

    engine = RAG(store_dir=path)
    if not engine.store.exists():
        raise InputError(
            f"--also-store {path}: no store there; give a directory `rag ingest --store` wrote"
        )
    return engine


def _print_references(answer) -> None:
    from rag.markers import reference_lines

    print()
    for line in reference_lines(answer):
        _print(line)
    if answer.uncited_sentences:
        print(f"Note: {len(answer.uncited_sentences)} sentence(s) of the answer cite no source.")
    if answer.mode == "llm" and answer.grounding is not None:
        print(
            f"Grounding: {answer.grounding:.0%} of the answer's claims are supported by the"
            " passages they cite."
        )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
