"""A Gradio chat over the paper store: streamed answers with linked [n] citations, a sources panel
and the map beside them.

This module lays out the page and keeps each session's history and per-turn sources in its own
`gr.State`, so sessions never see each other. How answers become markdown and HTML: `rag.ui.render`;
the CSP, the route allow-list and the login: `rag.ui.security`; the map: `rag.ui.map_view`. What the
page offers and how to run it: docs/ui.md.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr
from starlette.middleware import Middleware

from rag import Reading, Writing, latex, read_in_thread
from rag.cite import cited_paper_ids, format_citations
from rag.errors import RagError
from rag.net import is_loopback
from rag.text import CONTROL_CHARS

# Relative imports: at run time this package is `rag.ui` (pyproject maps it there), and mypy,
# which reads ui/ as the package `ui`, follows them here (an absolute `rag.ui...` it cannot find).
from .map_view import FRAME, HEAD_SCRIPT, MapPages
from .render import (
    md_math,
    md_text,
    reading_note,
    render_answer,
    render_found,
    render_note,
    render_reply,
    render_sources,
    render_turn_sources,
    shown_text,
    writing_note,
)
from .security import (
    CSPMiddleware,
    LoginThrottle,
    RouteGate,
    forwarded_for_trusted_only_when_configured,
    make_auth,
    parse_auth,
)

if TYPE_CHECKING:
    from rag import RAG

log = logging.getLogger(__name__)
CONCURRENCY_LIMIT = 16
CURSOR = "▌"
EXAMPLES = [  # used only when the store cannot give titles
    "How does Palimpsa relate to Mamba2?",
    "Which papers study backdoor attacks on language models?",
    "How can a Bayesian optimization run decide when to stop?",
]
EXAMPLE_TEMPLATES = (
    "What does the paper “{}” propose?",
    "What are the main results of “{}”?",
    "What problem does “{}” address?",
    "How does “{}” evaluate its method?",
)
EXAMPLE_TITLE_MAX = 60  # characters of a title in an example question
# a BM25 query most abstracts match
EXAMPLE_PROBE = "we propose a new method model learning results"
# The page's own CSS (package data), given to Gradio, which puts it in the page.
CSS = (resources.files("rag.ui") / "static" / "app.css").read_text(encoding="utf-8")

# The retrieval modes in a reader's words; the values are the engine's names
# (rag.config.RETRIEVAL_MODES).
MODE_CHOICES = [
    ("Meaning + keywords (recommended)", "hybrid"),
    ("Meaning (semantic)", "dense"),
    ("Keywords (exact terms)", "bm25"),
]
ADVANCED_MODE_CHOICES = [
    ("Rank fusion (RRF): merge the meaning and keyword result lists by rank", "hybrid-rrf"),
    ("Score blend: add up the meaning and keyword scores, with weights", "hybrid-convex"),
]
MODE_INFO = "Find papers by what your question means, by its exact words, or both."
OPTIONS_LABEL = "Options: how many papers, and how they are found"
# The chat's height: the viewport less the header, question box, examples and options (about 290
# px).
CHAT_HEIGHT = "calc(100vh - 290px)"
CHAT_MIN_HEIGHT = 260
ADVANCED_LABEL = "Advanced: how meaning and keywords are combined"


def short(text: str, limit: int = 48) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# ---------------------------------------------------------------- citations download

EXPORT_LABEL = "Export citations (BibTeX)"
_export_dir: Path | None = None
_export_lock = threading.Lock()


def citations_file(rag: RAG, paper_ids: list[str]) -> str | None:
    """A `citations.bib` of these papers for the download button (Gradio copies it into its cache
    to serve it); None when there is nothing to cite or the papers cannot be read.

    Written once per distinct content into a private temporary directory, removed at exit."""
    global _export_dir
    if not paper_ids:
        return None
    try:
        text = format_citations(rag.papers(paper_ids), "bibtex")
    except RagError as exc:  # e.g. the store went away: no download, the page still works
        log.info("no citations to export (%s)", exc)
        return None
    except Exception:
        log.exception("exporting the citations of %s failed", paper_ids)
        return None
    data = text.encode("utf-8")
    with _export_lock:
        if _export_dir is None or not _export_dir.is_dir():
            _export_dir = Path(tempfile.mkdtemp(prefix="rag-ui-citations-"))
            atexit.register(shutil.rmtree, _export_dir, True)
        target = _export_dir / hashlib.sha256(data).hexdigest()[:20] / "citations.bib"
        if not target.exists():
            target.parent.mkdir(exist_ok=True)
            staging = target.with_name(".citations.bib.tmp")
            staging.write_bytes(data)
            staging.replace(target)
    return str(target)


# ---------------------------------------------------------------- page parts

NO_LLM_NOTE = (
    "No language model is set up, so answers are sentences quoted word for word from the abstracts."
    " To have a model write them, set RAG_LLM=local or OPENAI_BASE_URL (rag doctor explains how)."
)


def header_text(rag: RAG) -> str:
    """One line above the chat: what is indexed and who writes the answers, in sentences."""
    try:
        papers = rag.stats().get("papers", "?")
    except Exception as exc:  # an unreadable store should not take the page down
        papers = f"? ({type(exc).__name__})"
    backend = rag.settings.llm_backend
    if backend == "none":
        model = md_text(NO_LLM_NOTE)
    elif backend == "local":
        path = getattr(rag.settings, "local_model_path", None)
        name = os.path.basename(str(path)) if path else "Qwen2.5-Coder-1.5B-Instruct"
        model = f"Answers are written by the local model **{md_text(name)}**."
    else:
        model = (
            f"Answers are written by **{md_text(str(rag.settings.llm_model))}**"
            f" ({md_text(backend)})."
        )
    return f"**Paper chat** · **{md_text(str(papers))}** papers indexed · {model}"


def corpus_examples(rag: RAG, n: int = 3) -> list[str]:
    """A few questions about papers in the store (titles found by a broad keyword search)."""
    try:
        hits = rag.search(EXAMPLE_PROBE, k=20, mode="bm25")
    except Exception as exc:  # no store, no keyword index: the fixed examples will do
        log.info("no corpus examples (%s); using the fixed ones", exc)
        return list(EXAMPLES)
    titles = list(dict.fromkeys(" ".join(s.title.split()) for s in hits))
    # Short titles: three examples sit in one row under the question box, each read whole.
    titles = (
        [t for t in titles if 12 <= len(t) <= EXAMPLE_TITLE_MAX]
        or [t for t in titles if 12 <= len(t) <= 90]
        or [short(t, 90) for t in titles]
    )
    if not titles:
        return list(EXAMPLES)
    step = max(1, len(titles) // n)
    picked = titles[::step][:n]
    return [EXAMPLE_TEMPLATES[i % len(EXAMPLE_TEMPLATES)].format(t) for i, t in enumerate(picked)]


# ---------------------------------------------------------------- the app


def _turn_choices(turns: list[dict]) -> list[tuple[str, int]]:
    return [(f"{i}. {short(latex.to_text(t['question']), 40)}", i) for i, t in enumerate(turns, 1)]


def offers_map(rag: RAG) -> bool:
    return callable(getattr(rag, "paper_map", None))


def build_app(rag: RAG) -> gr.Blocks:
    """The chat page for one shared, thread-safe `RAG`; chat history lives in per-session state."""
    examples = corpus_examples(rag)

    def pick_update(turns: list[dict], value: int | None):
        return gr.Radio(choices=_turn_choices(turns), value=value, visible=bool(turns))

    default_mode = rag.settings.mode
    advanced_modes = {value for _, value in ADVANCED_MODE_CHOICES}

    def respond(
        message: str,
        history: list[dict],
        chat: list[dict],
        turns: list[dict],
        k: float,
        mode: str | None,
        advanced: str | None = None,
    ):
        """One question; `mode` and `advanced` are the two retrieval radios (one of them is
        chosen)."""
        mode = advanced or mode or default_mode
        message = CONTROL_CHARS.sub(" ", message or "").strip()  # what is echoed is what is asked
        if not message:
            yield (gr.skip(),) * 7
            return
        turn = len(turns or []) + 1
        turns = list(turns or []) + [
            {"question": message, "sources": render_note(turn, message, "Finding sources…")}
        ]
        chat = list(chat or []) + [
            {"role": "user", "content": md_math(message)},
            {"role": "assistant", "content": CURSOR},
        ]
        # The download belongs to the answer shown last: hidden from here until this answer's comes
        # (in this first update, so it cannot land after the next download is shown, as a separate
        # event could).
        yield (
            "",
            chat,
            history,
            turns[-1]["sources"],
            turns,
            pick_update(turns, turn),
            gr.DownloadButton(visible=False),
        )
        pieces: list[str] = []
        try:
            stream = rag.stream(message, k=int(k), mode=mode, history=list(history) or None)
            # Read in a thread, with a tick when nothing comes: Gradio closes this generator at a
            # yield when the page goes away, and closing it stops the model (it would otherwise
            # finish the answer).
            for piece in read_in_thread(stream):
                if piece is None:
                    yield (gr.skip(),) * 7
                elif isinstance(piece, Reading):  # the papers found, shown while the model reads
                    chat[-1] = {"role": "assistant", "content": f"*{reading_note(piece)}* {CURSOR}"}
                    found = render_found(piece.papers, turn, message)
                    turns[-1] = {**turns[-1], "sources": found}
                    yield gr.skip(), chat, gr.skip(), found, turns, gr.skip(), gr.skip()
                elif isinstance(piece, Writing):  # its answer shows once checked, whole
                    chat[-1] = {"role": "assistant", "content": f"*{writing_note(piece)}* {CURSOR}"}
                    yield gr.skip(), chat, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
                elif not piece:
                    continue
                else:
                    pieces.append(piece)
                    # rendered as the final answer is (markers as text until the sources are known)
                    text = render_answer(shown_text("".join(pieces)), [])
                    chat[-1] = {"role": "assistant", "content": text + " " + CURSOR}
                    yield gr.skip(), chat, gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            answer = stream.answer
        except Exception as exc:  # a RagError says how to fix it; anything else is a bug: log it
            if not isinstance(exc, RagError):
                log.exception("answering %r failed", message)
            error = str(exc) or type(exc).__name__
            chat[-1] = {"role": "assistant", "content": f"⚠️ {md_text(error)}"}
            if pieces:  # a turn cut off mid-stream stays in the history, as far as it got
                history = list(history) + [
                    {"role": "user", "content": message},
                    {"role": "assistant", "content": "".join(pieces)},
                ]
            turns[-1] = {**turns[-1], "sources": render_note(turn, message, f"No sources: {error}")}
            yield (
                gr.skip(),
                chat,
                history,
                turns[-1]["sources"],
                turns,
                gr.Radio(value=turn),
                gr.skip(),
            )
            return
        chat[-1] = {"role": "assistant", "content": render_reply(answer, turn)}
        history = list(history) + [
            {"role": "user", "content": message},
            {"role": "assistant", "content": answer.answer},
        ]
        turns[-1] = {
            **turns[-1],
            "sources": render_turn_sources(answer, turn),
            "cited": cited_paper_ids(answer),
        }
        # the panel shows the new answer's sources, even if an earlier turn was picked meanwhile
        yield gr.skip(), chat, history, turns[-1]["sources"], turns, gr.Radio(value=turn), gr.skip()

    def export_citations(turns: list[dict]):
        """The download of the last answer's cited papers; hidden when it cites none (or failed)."""
        path = citations_file(rag, turns[-1].get("cited") or []) if turns else None
        return gr.DownloadButton(value=path, visible=path is not None)

    def show_turn(turn: int | None, turns: list[dict]):
        if not turn or not turns or not 1 <= int(turn) <= len(turns):
            return gr.skip()
        return turns[int(turn) - 1]["sources"]

    def select_message(turns: list[dict], evt: gr.SelectData):
        """A click on a message shows the sources of its turn (a user and an answer message
        each)."""
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not isinstance(index, int) or not turns:
            return gr.skip(), gr.skip()
        turn = min(index // 2 + 1, len(turns))
        return turns[turn - 1]["sources"], gr.Radio(value=turn)

    with gr.Blocks(title="Paper chat", analytics_enabled=False, fill_width=True) as demo:
        header = gr.Markdown(header_text(rag), elem_id="header")
        history = gr.State([])  # raw text turns for rag.stream(history=...); per browser session
        turns = gr.State([])  # per answered question: {question, sources (panel HTML)}; per session
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, elem_id="main"):
                # Math comes as MathML made on the server (md_math), not as KaTeX: KaTeX would take
                # every "$5 and $10" for math, and could not draw the sources panel.
                # allow_tags=False: with the default (True) Gradio shows tags it does not know,
                # <math> among them, as text; with False its sanitizer (still on) keeps MathML and
                # removes what it does not allow. The height leaves the question box, the examples
                # and the options on the first screen (measured in Chromium at 1280x720 and
                # 1440x900: tests/test_ui.py).
                chatbot = gr.Chatbot(
                    elem_id="chat",
                    label="Chat",
                    show_label=False,
                    height=CHAT_HEIGHT,
                    min_height=CHAT_MIN_HEIGHT,
                    latex_delimiters=[],
                    buttons=["copy"],
                    feedback_options=None,
                    sanitize_html=True,
                    allow_tags=False,
                    placeholder="Ask about the indexed ML papers.",
                )
                msg = gr.Textbox(
                    placeholder="Ask a question and press Enter",
                    show_label=False,
                    elem_id="question",
                    max_lines=4,
                    submit_btn=True,
                )
                # The examples right under the box; a click asks the question (not only fills the
                # box).
                with gr.Row(elem_id="examples", equal_height=True):
                    example_buttons = [
                        gr.Button(
                            q,
                            size="sm",
                            variant="secondary",
                            elem_classes=["example-q"],
                            min_width=120,
                        )
                        for q in examples
                    ]
                # Options weigh less than the examples: folded, one line until opened.
                with gr.Row(elem_id="options-row"):
                    with gr.Accordion(
                        OPTIONS_LABEL, open=default_mode in advanced_modes, elem_id="options"
                    ):
                        with gr.Row():
                            k = gr.Slider(
                                1, 20, value=rag.settings.top_k, step=1, label="Papers (k)", scale=1
                            )
                            mode = gr.Radio(
                                MODE_CHOICES,
                                label="Find papers by",
                                info=MODE_INFO,
                                elem_id="mode",
                                value=None if default_mode in advanced_modes else default_mode,
                                scale=2,
                            )
                        # The fusion variants, folded away unless one of them is the configured
                        # default.
                        with gr.Accordion(
                            ADVANCED_LABEL,
                            open=default_mode in advanced_modes,
                            elem_id="mode-advanced",
                        ):
                            advanced = gr.Radio(
                                ADVANCED_MODE_CHOICES,
                                show_label=False,
                                elem_id="mode-fusion",
                                value=default_mode if default_mode in advanced_modes else None,
                            )
                    clear = gr.Button(
                        "Clear",
                        variant="secondary",
                        elem_id="clear",
                        size="sm",
                        scale=0,
                        min_width=80,
                    )
            # Sticky: the sources stay on screen however far the page scrolls (it scrolls inside
            # itself).
            with gr.Column(scale=2, elem_id="side"), gr.Tabs(elem_id="side-tabs"):
                with gr.Tab("Sources", elem_id="tab-sources"):
                    pick = gr.Radio(
                        [], label="Sources for answer", elem_id="turn-pick", visible=False
                    )
                    # Above the panel: the panel's cards can overflow its box onto whatever sits
                    # below it.
                    export = gr.DownloadButton(
                        EXPORT_LABEL, visible=False, elem_id="export-bib", size="sm"
                    )
                    sources = gr.HTML(render_sources(None), elem_id="sources", label="Sources")
                if offers_map(rag):  # the papers' map (ui/map_view.py); lit up from the panel shown
                    with gr.Tab("Map", elem_id="tab-map"):
                        gr.HTML(FRAME, elem_id="map-view")
        # A question sent while an answer streams is kept in the box and asked when that answer ends
        # (Gradio's default, trigger_mode="once", drops it). An example button asks its own text (a
        # Button's value is its label), the same way; the API keeps one documented endpoint
        # (/respond, the box's), and all of them share one concurrency limit.
        for trigger, question in [(msg.submit, msg)] + [(b.click, b) for b in example_buttons]:
            trigger(
                respond,
                [question, history, chatbot, turns, k, mode, advanced],
                [msg, chatbot, history, sources, turns, pick, export],
                concurrency_limit=CONCURRENCY_LIMIT,
                concurrency_id="respond",
                show_progress="hidden",
                trigger_mode="always_last",
                api_visibility="public" if question is msg else "undocumented",
            ).then(
                export_citations,
                [turns],
                export,
                concurrency_limit=CONCURRENCY_LIMIT,
                show_progress="hidden",
            )
        pick.input(show_turn, [pick, turns], sources, queue=False, show_progress="hidden")
        # One retrieval mode at a time: a choice in either radio clears the other.
        mode.input(lambda: None, None, advanced, queue=False, show_progress="hidden")
        advanced.input(lambda: None, None, mode, queue=False, show_progress="hidden")
        chatbot.select(
            select_message, [turns], [sources, pick], queue=False, show_progress="hidden"
        )

        def reset():
            return (
                [],
                [],
                [],
                render_sources(None),
                "",
                gr.Radio(choices=[], value=None, visible=False),
                gr.DownloadButton(value=None, visible=False),
            )

        outputs = [chatbot, history, turns, sources, msg, pick, export]
        clear.click(reset, None, outputs, queue=False)
        chatbot.clear(reset, None, outputs, queue=False)  # its own trash icon
        demo.load(lambda: header_text(rag), None, header, queue=False)
    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT)
    return demo


def launch(
    rag: RAG | None = None,
    host: str | None = None,
    port: int | None = None,
    block: bool = True,
    auth: str | None = None,
    login_throttle: LoginThrottle | None = None,
) -> gr.Blocks:
    """Serve the UI; host/port default to `rag.settings.ui_host`/`ui_port` (127.0.0.1:7860).

    `auth` ("user:password") defaults to `RAG_UI_AUTH`; `login_throttle` caps login attempts per
    client (default 5 a minute). With `block=False` the server runs in a background thread; call
    `.close()` on the result.
    """
    if rag is None:
        from rag import RAG as _RAG

        rag = _RAG()
    host = host or rag.settings.ui_host
    pair = parse_auth(auth if auth is not None else rag.settings.ui_auth)
    if not is_loopback(host) and pair is None:
        log.warning(
            "the UI listens on %s without a login: anyone who can reach it can use it "
            "(set RAG_UI_AUTH=user:password)",
            host,
        )
    demo = build_app(rag)
    throttle = login_throttle or LoginThrottle()
    map_pages = MapPages(rag) if offers_map(rag) else None
    # The login form shows nothing for a 429: the page says the rule up front instead.
    auth_message = (
        f"Paper chat: log in with the RAG_UI_AUTH user and password. After {throttle.attempts}"
        f" failed tries, wait {throttle.window:g} s before trying again."
    )
    theme = gr.themes.Soft(
        font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    # share=False: no public tunnel even if GRADIO_SHARE is set. quiet=True: Gradio's banner tells a
    # CLI user to "set share=True in launch()"; the one line printed below says what they need.
    # max_file_size: a second bound on uploads, which RouteGate already refuses. X-Forwarded-For is
    # not taken as the client's address (the login throttle's key) unless configured.
    with forwarded_for_trusted_only_when_configured():
        demo.launch(
            server_name=host,
            server_port=port or rag.settings.ui_port,
            share=False,
            auth=make_auth(pair) if pair else None,
            auth_message=auth_message if pair else None,
            # outermost: headers on every answer
            app_kwargs={
                "middleware": [
                    Middleware(CSPMiddleware),
                    Middleware(RouteGate, throttle=throttle, map_pages=map_pages),
                ]
            },
            ssr_mode=False,
            max_file_size="1kb",
            prevent_thread_lock=True,
            theme=theme,
            css=CSS,
            head=HEAD_SCRIPT,
            footer_links=[],
            run_history=False,
            enable_monitoring=False,
            mcp_server=False,
            pwa=False,
            show_error=True,
            quiet=True,
        )
    if map_pages is not None:
        map_pages.start()  # laid out while the first question is typed
    if block:
        print(f"Paper chat on {demo.local_url} (Ctrl+C stops it)", flush=True)
        demo.block_thread()
    return demo


if __name__ == "__main__":
    launch()
