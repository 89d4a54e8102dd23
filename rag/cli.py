"""The `rag` command: parses arguments and renders; the engine does the work.

Exit codes: 0 done, 1 user or runtime error (one line on stderr), 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints the whole usage)
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _mode(text: str) -> str:
    modes = _modes(text)
    if len(modes) != 1:
        raise argparse.ArgumentTypeError(f"expected one retrieval mode, got {text!r}")
    return modes[0]


def _modes(text: str) -> list[str]:
    from .errors import InputError
    from .retrieval import check_mode

    try:
        modes = [check_mode(m.strip()) for m in text.split(",") if m.strip()]
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not modes:
        raise argparse.ArgumentTypeError(f"expected one or more retrieval modes, got {text!r}")
    return modes


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rag", description="Ask questions about ML paper abstracts; answers cite their papers.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p):
        p.add_argument("--store", type=Path, help="store directory (default: RAG_STORE_DIR or the project's store/)")
        return p

    p = common(sub.add_parser("ingest", help="add corpus files (.txt seed format, .jsonl, .csv, .gz) to the index"))
    p.add_argument("paths", nargs="*", type=Path, help="files or directories to add")
    p.add_argument("--rebuild", action="store_true", help="empty the index and re-ingest corpus/ plus PATHs")
    p.add_argument("--no-corpus", action="store_true", help="do not add corpus/ to an empty store")

    for name, helptext in (("ask", "answer a question with citations"), ("search", "list the papers that match")):
        p = common(sub.add_parser(name, help=helptext))
        p.add_argument("question" if name == "ask" else "query")
        p.add_argument("--k", type=_positive_int, help="number of papers to retrieve (default 5)")
        p.add_argument("--mode", type=_mode, help="retrieval mode: bm25, dense, hybrid (default), hybrid-rrf, "
                       "hybrid-convex")
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "ask":
            p.add_argument("--no-llm", action="store_true", help="extractive answer even when an LLM is configured")

    p = common(sub.add_parser("stats", help="papers, chunks, embedding model and store location"))
    p.add_argument("--json", action="store_true", help="print JSON")

    p = common(sub.add_parser("eval", help="retrieval and answer metrics over a question file"))
    p.add_argument("questions", type=Path, help="JSONL file: {id, question, gold, kind, key_facts?} per line")
    p.add_argument("--mode", action="append", type=_modes, default=[],
                   help="retrieval mode(s) to compare: repeat or comma-separate (default: the configured mode)")
    p.add_argument("--k", type=_positive_int, help="papers given to the answerer (default 5); retrieval uses 10")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--no-answers", action="store_true", help="retrieval metrics only")
    p.add_argument("--ci", action="store_true", help="add a 95%% interval to every figure (Wilson or bootstrap over the questions)")
    p.add_argument("--misses", action="store_true", help="list the questions each mode does not rank first")

    p = common(sub.add_parser("doctor", help="check the configuration, store, embedding model and LLM endpoint"))
    p.add_argument("--json", action="store_true", help="print JSON")

    p = common(sub.add_parser("ui", help="start the browser chat"))
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 7860 or GRADIO_SERVER_PORT)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import RagError

    try:
        return _run(args)
    except RagError as exc:
        print(f"rag: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `rag stats | head -1`
        sys.stderr.close()
        return 0


def _run(args) -> int:
    from .engine import RAG

    overrides = {"store_dir": args.store} if args.store else {}
    rag = RAG(**overrides)
    if args.command == "ingest":
        report = rag.ingest(args.paths, rebuild=args.rebuild, include_corpus=not args.no_corpus, progress=True)
        print(report.summary())
        return 0
    if args.command == "stats":
        stats = rag.stats()
        if args.json:
            print(json.dumps(stats, indent=2))
        else:
            for key, value in stats.items():
                print(f"{key}: {value}")
        return 0
    if args.command == "doctor":
        return _doctor(rag, args)
    if args.command == "search":
        sources = rag.search(args.query, k=args.k, mode=args.mode)
        if args.json:
            print(json.dumps({"query": args.query, "mode": args.mode or rag.settings.mode,
                              "results": [s.model_dump() for s in sources]}, indent=2))
        else:
            for s in sources:
                print(f"[{s.n}] {s.title} ({s.paper_id}) score {s.score:.2f}")
                if s.url:
                    print(f"    {s.url}")
        return 0
    if args.command == "ask":
        return _ask(rag, args)
    if args.command == "eval":
        return _eval(rag, args)
    if args.command == "ui":
        from ui.app import launch

        launch(rag, host=args.host, port=args.port)
        return 0
    return 2


def _doctor(rag, args) -> int:
    from dataclasses import asdict

    from .doctor import run_checks

    checks = run_checks(rag)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            print(f"{c.status.upper():4s}  {c.name}: {c.detail}" + (f"\n      fix: {c.fix}" if c.fix and c.status != "ok" else ""))
    return 1 if any(c.status == "fail" for c in checks) else 0


def _ask(rag, args) -> int:
    from .citations import plain_text
    from .models import Answer

    answer, waiting = None, False
    show_wait = not args.json and sys.stderr.isatty()
    for piece in rag.stream(args.question, k=args.k, mode=args.mode, llm=not args.no_llm):
        if isinstance(piece, Answer):
            answer = piece
        elif piece == "" and show_wait and not waiting:
            waiting = True  # sources found; a local model takes seconds to read them
            sys.stderr.write("rag: the model is reading the sources…")
            sys.stderr.flush()
        elif not args.json and piece:
            if waiting:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
                waiting = False
            print(plain_text(piece), end="", flush=True)  # live: markers arrive already renumbered
    if waiting:
        sys.stderr.write("\r\033[K")
    assert answer is not None
    if args.json:
        print(answer.to_json())
        return 0
    print()
    if answer.withdrawn is not None:
        print("rag: withdrawn: no citation of that answer is supported by the passage it cites", file=sys.stderr)
        print(answer.answer)
    if answer.error:
        print(f"rag: warning: {answer.error}; showing an extractive answer", file=sys.stderr)
    if answer.removed_markers:
        marks = ", ".join(f"[{n}]" for n in answer.removed_markers)
        print(f"rag: warning: removed citation markers that match no source: {marks}", file=sys.stderr)
    _print_references(answer)
    return 0


def _eval(rag, args) -> int:
    from .evaluation import evaluate, load_questions, render_markdown

    questions = load_questions(args.questions)
    modes = list(dict.fromkeys(m for group in args.mode for m in group)) or [rag.settings.mode]
    result = evaluate(rag, questions, modes, k=args.k or 5, answers=not args.no_answers,
                      progress=sys.stderr.isatty(), ci=args.ci)
    if result["missing_gold"]:
        listed = "; ".join(f"{q}: {', '.join(ids)}" for q, ids in list(result["missing_gold"].items())[:5])
        more = f"; and {len(result['missing_gold']) - 5} more" if len(result["missing_gold"]) > 5 else ""
        print(f"rag: warning: {args.questions}: gold paper ids not in the index count as misses ({listed}{more})",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"file": str(args.questions), **result}, indent=2))
    else:
        print(render_markdown(result, source=str(args.questions), misses=args.misses), end="")
    return 0


def _print_references(answer) -> None:
    unsupported = {c.n for c in answer.citations if c.supported is False}
    cited, others = answer.cited_sources, [s for s in answer.sources if not s.cited]
    print()
    if cited:
        print("References:")
        for s in cited:
            flag = "  (not supported by this passage)" if s.n in unsupported else ""
            print(f"[{s.n}] {s.title}" + (f" — {s.url}" if s.url else "") + flag)
    if others:
        print("Also retrieved:" if cited else "Nearest papers:")
        for s in others:
            print(f"    {s.title}" + (f" — {s.url}" if s.url else ""))
    if answer.uncited_sentences:
        print(f"Note: {len(answer.uncited_sentences)} sentence(s) of the answer cite no source.")
    if answer.mode == "llm" and answer.grounding is not None:
        print(f"Grounding: {answer.grounding:.0%} of the answer's claims are supported by the passages they cite.")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
