"""A Gradio chat over the paper store: streamed answers with linked [n] citations and a sources panel.

- Each answer streams into the chat; its `[n]` markers link to the cited papers, unsupported ones are
  flagged, and the message ends with its own reference list, so scrolling back shows what each
  answer cited. The sources panel shows one turn at a time (the latest by default); the "Sources
  for" selector, or a click on an earlier answer, switches it to that turn.
- Cards show title (or label), authors, link, the retrieval rank with its named scores (fused, cosine,
  keyword) and the passage with the sentences behind the citations highlighted; papers retrieved but
  not cited are listed apart.
- Chat history and per-turn sources live in per-session `gr.State`: sessions never see each other.
- Everything shown that comes from the corpus or a model is HTML-escaped (and markdown links/images
  are neutralised in the chat), and every response carries a Content-Security-Policy so nothing
  remote - images, scripts, fonts - can load even if some markup slipped through. Its LaTeX math
  (`$R^2=1$`) is shown as MathML rebuilt from a whitelist, or as plain text (`rag.latex`).
- One screen: the header says in a sentence who writes the answers; three example questions sit under the
  question box (a click asks one); k and the retrieval mode are folded under "Options"; the side column
  (Sources, Map) is sticky, so it stays on screen when the page scrolls.
- The answer's own text is shown as the sources panel shows passages: LaTeX as MathML or its character
  (`95\\%` -> 95%), markdown emphasis drawn (`md_answer`), while it streams and after.
- Retrieval is offered in a reader's words ("Meaning + keywords", "Meaning", "Keywords"); the two
  fusion variants wait behind an "Advanced" fold. The engine gets its own names for them.
- Binds 127.0.0.1 unless told otherwise; `RAG_UI_AUTH=user:password` puts a login in front, and each
  client address gets a few login attempts per window (`LoginThrottle`).
- Only the routes the page and `gradio_client` use are open (`RouteGate`): no uploads, no OpenAPI
  schema, no unknown API names; everything else is a 404. Gradio's file route serves only the .bib
  files it copied into its own cache (the "Export citations (BibTeX)" download of the last answer).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import hmac
import html
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection

from rag import latex
from rag.answer.citations import MARKER, parse_markers, plain_text
from rag.backends.chat import read_in_thread
from rag.cite import cited_paper_ids, format_citations
from rag.config import is_loopback
from rag.errors import InputError, RagError
from rag.index.corpus import CONTROL_CHARS
from rag.prompts import ABSTAIN_ANSWER, REFUSAL
from rag.ui.map_view import FRAME, HEAD_SCRIPT, MAP_PATH, MapPages, map_attribute

if TYPE_CHECKING:
    from rag import RAG
    from rag.models import Answer, Source

log = logging.getLogger(__name__)
CONCURRENCY_LIMIT = 16
CURSOR = "▌"
READING = "Reading the sources…"
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
EXAMPLE_PROBE = "we propose a new method model learning results"  # a BM25 query most abstracts match
UNSUPPORTED = "not supported by the passage it cites"
# The library says the nearest papers are "listed as sources"; the page says where that is.
UI_ABSTAIN = REFUSAL + " The nearest papers are listed in the Sources panel on the right."
LOGIN_FAIL_DELAY = 1.0  # seconds before a wrong password is refused (slows guessing)
# Measured in Chromium (Gradio 6.31): without 'unsafe-inline' the page's inline bootstrap scripts are
# blocked (blank page); without 'unsafe-eval' every gr.HTML (the sources panel) fails with "Error
# rendering HTML", because Gradio compiles its template with Function(). Both stay; everything else
# is as tight as the page allows ('self' for <base>, data: images and fonts for the theme).
CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "media-src 'none'",
    "worker-src 'none'",
    "frame-src 'self'",  # the map beside the chat (/map)
    "manifest-src 'none'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'self'",  # only the chat may frame its map
])
CSS = """
/* The side column stays on screen when the page scrolls; its panel and map scroll inside it. */
#side { position: sticky; top: 8px; align-self: flex-start; max-height: calc(100vh - 16px); overflow-y: auto; }
#header { margin-bottom: -6px; }  #header p { margin: 0; }
/* Example questions: read whole (wrapped, never cut), left-aligned, lighter than the send button. */
#examples { gap: 6px; }
#examples button.example-q { white-space: normal; text-align: left; justify-content: flex-start; height: auto;
  font-weight: 400; line-height: 1.3; padding: 6px 10px; }
#options-row { align-items: flex-start; gap: 8px; }
#options > button, #options .label-wrap { padding-top: 6px; padding-bottom: 6px; font-size: 0.9em; }
.src-card { overflow-wrap: anywhere; }  /* a 300-character "word" in a title or passage wraps */
.src-card { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 10px; margin: 6px 0; }
.src-card:target { border-color: var(--color-accent); box-shadow: 0 0 0 2px var(--color-accent-soft); }
.src-card.src-unsupported { border-color: #d97706; }
.src-title { font-weight: 600; } .src-meta { font-size: 0.85em; opacity: 0.8; }
.src-passage { font-size: 0.9em; margin-top: 4px; white-space: pre-wrap; }
.src-passage mark, .src-evidence mark { background: #fde68a; color: inherit; padding: 0 1px; border-radius: 2px; }
.src-evidence { font-size: 0.9em; margin-top: 4px; }
.src-uncited { opacity: 0.75; } .src-head { font-weight: 600; margin: 10px 0 2px; }
.src-turn { font-size: 0.9em; margin-bottom: 4px; opacity: 0.85; }
.badge-unsupported { color: #b45309; font-weight: 600; font-size: 0.85em; }
#turn-pick label { padding: 2px 8px; font-size: 0.9em; }
#chat a.cite { color: var(--color-accent); text-decoration: none; font-weight: 600; }
#chat a.cite.unsupported { color: #b45309; text-decoration: underline wavy #d97706; }
#chat .flag-unsupported { color: #b45309; font-size: 0.8em; }
/* Math a little larger than the text around it (the math font's letters are smaller at one size);
   MathML Core leaves mathvariant to the page (\textit, \textbf, \boldsymbol). */
#chat math, #sources math { font-size: 1.1em; }
math [mathvariant="italic"] { font-style: italic; } math [mathvariant="bold"] { font-weight: bold; }
math [mathvariant="bold-italic"] { font-style: italic; font-weight: bold; }
"""

# The retrieval modes in a reader's words; the values are the engine's names (rag.config.RETRIEVAL_MODES).
MODE_CHOICES = [("Meaning + keywords (recommended)", "hybrid"),
                ("Meaning (semantic)", "dense"),
                ("Keywords (exact terms)", "bm25")]
ADVANCED_MODE_CHOICES = [("Rank fusion (RRF): merge the meaning and keyword result lists by rank", "hybrid-rrf"),
                         ("Score blend: add up the meaning and keyword scores, with weights", "hybrid-convex")]
MODE_INFO = "Find papers by what your question means, by its exact words, or both."
OPTIONS_LABEL = "Options: how many papers, and how they are found"
# The chat's height: the viewport less the header, question box, examples and options (about 290 px).
CHAT_HEIGHT = "calc(100vh - 290px)"
CHAT_MIN_HEIGHT = 260
ADVANCED_LABEL = "Advanced: how meaning and keywords are combined"

_MD_SPECIAL = re.compile(r"([\\`\[\]$<>*_~])")  # no links, images, code spans, math, emphasis
_AUTOLINK = re.compile(r"://|(?<![\w.])www\.|@", re.I)
_AUTOLINK_BREAK = {"/": lambda s: "&#58;//", ".": lambda s: s[:-1] + "&#46;", "@": lambda s: "&#64;"}


async def send_json(send, status: int, body: dict, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """A small JSON response from ASGI middleware (Gradio's error shape: {"detail": ...})."""
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": data})


async def send_html(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


class CSPMiddleware:
    """Pure ASGI middleware (safe for streaming responses) adding the CSP and nosniff headers.

    It sits outside the app's routes, so an error a route does not handle becomes a 500 here, with
    the headers; Starlette's own error page would come from outside every middleware, without them."""

    def __init__(self, app: Any, policy: str = CSP) -> None:
        self.app, self.policy = app, policy.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_with_headers(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"content-security-policy"]
                headers += [(b"content-security-policy", self.policy),
                            (b"x-content-type-options", b"nosniff")]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:  # mid-stream: nothing more can be said to this client
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            await send_json(send_with_headers, 500, {"detail": "internal error (see the server log)"})


@dataclass
class LoginThrottle:
    """At most `attempts` login attempts per client address in any `window` seconds.

    Attempts are counted when they arrive, so parallel guesses cannot slip past the cap while the
    first ones are still being checked; a successful login clears the address's count. Behind a
    reverse proxy every client shares the proxy's address (and its limit)."""

    attempts: int = 5
    window: float = 60.0
    _seen: dict[str, deque] = field(default_factory=dict, repr=False)

    def acquire(self, client: str) -> float:
        """0 when this attempt may go ahead (and is counted), else the seconds until one may."""
        now = time.monotonic()
        if len(self._seen) > 10_000:  # forget idle addresses so the table stays small
            self._seen = {k: q for k, q in self._seen.items() if q and now - q[-1] < self.window}
        times = self._seen.setdefault(client, deque())
        while times and now - times[0] >= self.window:
            times.popleft()
        if len(times) >= self.attempts:
            return self.window - (now - times[0])
        times.append(now)
        return 0.0

    def succeeded(self, client: str) -> None:
        self._seen.pop(client, None)


# (method, path) pairs the page and gradio_client use, measured in Chromium and with gradio_client:
# GET  /, /assets/*, /static/*, /theme.css, /favicon.ico, /config, /gradio_api/info, .../queue/data,
#      .../heartbeat/<session> (frees a closed tab's state), .../startup-events (launch() calls it)
# POST /login, .../queue/join, .../run/predict (the page's unqueued events, by fn_index)
_OPEN_GET = re.compile(r"/(|assets/.+|static/.+|theme\.css|favicon\.ico|robots\.txt|config|logout|"
                       r"gradio_api/(info|queue/data|startup-events))")
_OPEN_POST = re.compile(r"/(login|gradio_api/queue/join)")
_API_CALL = {"POST": re.compile(r"/gradio_api/(?:run|api|call|call/v2)/([^/]+)"),  # by name; and the result:
             "GET": re.compile(r"/gradio_api/call/(?:v2/)?([^/]+)/[^/]+")}
_HEARTBEAT = re.compile(r"/gradio_api/heartbeat/[^/]+")
# Gradio's file route, opened only for the files the page offers for download (see `_served_file`).
_FILE = re.compile(r"/gradio_api/file=(/.+)")
SERVED_SUFFIXES = (".bib",)


class RouteGate:
    """Pure ASGI middleware: only the routes the app uses answer; the login is throttled per client.

    Everything else - uploads (the page has no file input: a way to fill the disk), the OpenAPI
    schema, /reset, Gradio's dev and vibe-coding routes - is a 404, as is an API name the app does
    not define (Gradio answers those with a 500). With a login, the heartbeat needs the login too."""

    def __init__(self, app: Any, throttle: LoginThrottle | None = None, map_pages: MapPages | None = None) -> None:
        self.app, self.throttle, self.map_pages = app, throttle or LoginThrottle(), map_pages

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gradio_app, method = scope["app"], scope["method"]
        path = scope["path"].rstrip("/") or "/"
        if method in ("GET", "HEAD") and (_OPEN_GET.fullmatch(path) or
                                          _HEARTBEAT.fullmatch(path) and self._logged_in(scope, gradio_app)):
            return await self.app(scope, receive, send)
        if method in ("GET", "HEAD") and path == MAP_PATH and self.map_pages is not None:
            if not self._logged_in(scope, gradio_app):
                return await send_json(send, 401, {"detail": "Not authenticated: log in on the chat page first"})
            status, body = await asyncio.to_thread(self.map_pages.page)
            return await send_html(send, status, body if method == "GET" else b"")
        served = method in ("GET", "HEAD") and _FILE.fullmatch(path)
        if served and self._served_file(served.group(1), gradio_app):
            return await self.app(scope, receive, send)  # Gradio checks the login itself
        if method == "POST" and path == "/login" and gradio_app.auth is not None:
            return await self._login(scope, receive, send)
        if method == "POST" and _OPEN_POST.fullmatch(path):
            return await self.app(scope, receive, send)
        api = _API_CALL.get(method) and _API_CALL[method].fullmatch(path)
        if api:
            names = {fn.api_name for fn in gradio_app.get_blocks().fns.values()} | {"predict"}
            if api.group(1) in names:
                return await self.app(scope, receive, send)
            return await send_json(send, 404, {"detail": f"no API named {api.group(1)!r}"})
        await send_json(send, 404, {"detail": "Not Found"})

    @staticmethod
    def _served_file(path: str, gradio_app) -> bool:
        """A download the page offers: a .bib file that Gradio copied into its cache (its upload
        directory, which takes no uploads here). Not a URL (Gradio would fetch it), nor anything else."""
        if "://" in path or not path.lower().endswith(SERVED_SUFFIXES):
            return False
        try:
            target, cache = Path(path).resolve(), Path(gradio_app.uploaded_file_dir).resolve()
            return target.is_relative_to(cache) and target != cache and target.is_file()
        except (OSError, ValueError, AttributeError):
            return False

    @staticmethod
    def _logged_in(scope, gradio_app) -> bool:
        if gradio_app.auth is None:
            return True
        cookies = HTTPConnection(scope).cookies
        return any(cookies.get(f"{name}-{gradio_app.cookie_id}") in gradio_app.tokens
                   for name in ("access-token", "access-token-unsecure"))

    async def _login(self, scope, receive, send):
        client = (scope.get("client") or ("unknown",))[0]
        wait = self.throttle.acquire(client)
        if wait:
            seconds = math.ceil(wait)
            return await send_json(send, 429, {"detail": f"Too many login attempts; try again in {seconds} s."},
                                   [(b"retry-after", str(seconds).encode())])
        status = 0

        async def watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, watch)
        if status == 200:
            self.throttle.succeeded(client)


# ---------------------------------------------------------------- escaping

def esc(text: Any) -> str:
    """Plain text -> safe for an HTML context."""
    return html.escape("" if text is None else str(text), quote=True)


def md_text(text: str) -> str:
    """Plain text -> chat markdown that renders as that text: no HTML, links, images, code or math.

    Bare URLs, www. names and e-mail addresses would become links (GFM autolinks): an entity in
    each (rendered as the same character) keeps them text."""
    out = _MD_SPECIAL.sub(r"\\\1", esc(text))
    return _AUTOLINK.sub(lambda m: _AUTOLINK_BREAK[m.group(0)[-1]](m.group(0)), out)


def md_math(text: str) -> str:
    """Text that may hold LaTeX -> chat markdown: its math as MathML, everything else as `md_text`.

    The MathML is rebuilt from a whitelist and holds only tags and character references
    (`rag.latex`); Gradio's sanitizer keeps it when the Chatbot has `allow_tags=False`."""
    return latex.to_html(text, md_text)


_MD_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_MD_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_MD_EMPHASIS = re.compile(_MD_BOLD.pattern + "|" + _MD_ITALIC.pattern)


def md_emphasis(text: str) -> str:
    """Plain text -> chat markdown, as `md_text`, but with the markdown emphasis a model or an abstract
    writes (`**Palimpsa**`, `*not*`) drawn as <strong>/<em> around escaped text, as the sources panel
    draws it (`esc_emphasis`). Underscores and ~~ stay as written."""
    out, pos = [], 0
    for m in _MD_EMPHASIS.finditer(text):
        bold, italic = m.group(1), m.group(2)
        out.append(md_text(text[pos:m.start()]))
        out.append(f"<strong>{md_text(bold)}</strong>" if bold is not None else f"<em>{md_text(italic)}</em>")
        pos = m.end()
    out.append(md_text(text[pos:]))
    return "".join(out)


def md_answer(text: str) -> str:
    """A model's (or the extractive) answer text -> chat markdown: LaTeX as the sources panel shows it
    (math as MathML, `95\\%` as "95%", `\\textbf{x}` bold) and markdown emphasis drawn; nothing else
    becomes markup."""
    return latex.to_html(text, md_emphasis)


def esc_emphasis(text: str) -> str:
    """Plain text -> HTML, escaped, with the markdown emphasis abstracts carry (`**F**unction-**I**nformed`)
    drawn as emphasis instead of shown as asterisks. Only <strong> and <em> are made, around escaped text."""
    return _MD_ITALIC.sub(r"<em>\1</em>", _MD_BOLD.sub(r"<strong>\1</strong>", esc(text)))


def html_math(text: str) -> str:
    """Text that may hold LaTeX -> HTML for the sources panel: math as MathML, the rest escaped (a title's
    asterisks stay as written; passages draw their emphasis: `highlight`)."""
    return latex.to_html(text, esc)


def safe_url(url: str | None) -> str | None:
    return url if url and re.match(r"https?://", url, re.I) else None


def short(text: str, limit: int = 48) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


# ---------------------------------------------------------------- the answer in the chat

def _card_id(n: int, turn: int | None) -> str:
    return f"src-{turn}-{n}" if turn is not None else f"src-{n}"


def _unsupported(answer: Answer) -> set[int]:
    return {c.n for c in answer.citations if c.supported is False}


def _cite_link(n: int, by_n: dict[int, Source], turn: int | None, unsupported: set[int] | frozenset[int]) -> str:
    src = by_n.get(n)
    if src is None:
        return f"\\[{n}\\]"
    url = safe_url(src.url)
    href = url or f"#{_card_id(n, turn)}"
    target = ' target="_blank" rel="noopener noreferrer"' if url else ""
    if n in unsupported:
        return (f'<a class="cite unsupported" href="{esc(href)}" title="{esc(latex.to_text(src.title))} '
                f'({UNSUPPORTED})"{target}>[{n}]</a><span class="flag-unsupported" title="{UNSUPPORTED}">⚠</span>')
    return f'<a class="cite" href="{esc(href)}" title="{esc(latex.to_text(src.title))}"{target}>[{n}]</a>'


def render_answer(text: str, sources: list[Source], turn: int | None = None,
                  unsupported: set[int] | frozenset[int] = frozenset()) -> str:
    """Answer text -> chat markdown with every [n] (or [n, m]) marker linked to its paper, math as math."""
    by_n = {s.n: s for s in sources}
    out, pos = [], 0
    for m in MARKER.finditer(text):
        out.append(md_answer(plain_text(text[pos:m.start()])))
        out.append("".join(_cite_link(n, by_n, turn, unsupported) for n in dict.fromkeys(parse_markers(m.group()))))
        pos = m.end()
    out.append(md_answer(plain_text(text[pos:])))
    return "".join(out)


def render_references(answer: Answer, turn: int | None = None) -> str:
    """The cited papers of one answer as a compact list that stays with its message."""
    cited = [s for s in answer.sources if s.cited]
    if not cited:
        return ""
    unsupported = _unsupported(answer)
    lines = []
    for s in cited:
        url = safe_url(s.url)
        title = md_math(latex.shorten(s.title, 110))
        title = (f'<a class="ref" href="{esc(url)}" target="_blank" rel="noopener noreferrer">{title}</a>'
                 if url else title)
        flag = f' <span class="flag-unsupported">⚠ {UNSUPPORTED}</span>' if s.n in unsupported else ""
        lines.append(f"\\[{s.n}\\] {title}{flag}")
    return "**References**  \n" + "  \n".join(lines)


def reading_note(piece: str) -> str:
    """The line shown while the model reads the sources, with the engine's estimate when it has one."""
    seconds = getattr(piece, "seconds", None)
    if not seconds:
        return f"{READING} (a model on a CPU takes a few seconds before its first word)"
    return f"{READING} about {seconds:.0f} s before the first word"


def shown_text(text: str) -> str:
    """The answer text as the page shows it: an abstention says where the nearest papers are."""
    return text.replace(ABSTAIN_ANSWER, UI_ABSTAIN)


def render_reply(answer: Answer, turn: int | None = None) -> str:
    """The final chat message of a turn: error line, linked answer, grounding, references."""
    parts = []
    if answer.error:  # the library's fallback answer follows, with the sources
        parts.append(f"⚠️ **LLM failed:** {md_text(answer.error)}")
    parts.append(render_answer(shown_text(answer.answer), answer.sources, turn, _unsupported(answer)))
    if answer.mode == "llm" and not answer.abstained:
        notes = []
        if answer.grounding is not None:
            notes.append(f"grounding {answer.grounding:.0%}: share of claims supported by the passages they cite")
        uncited = len(getattr(answer, "uncited_sentences", None) or [])
        if not answer.citations:
            notes.append("⚠ this answer cites no paper: check it against the sources")
        elif uncited:
            notes.append(f"⚠ {uncited} sentence{'s' if uncited > 1 else ''} cite{'' if uncited > 1 else 's'} no paper")
        if notes:
            parts.append(f"<sub>{' · '.join(notes)}</sub>")
    refs = render_references(answer, turn)
    if refs:
        parts.append(refs)
    return "\n\n".join(parts)


# ---------------------------------------------------------------- the sources panel

def highlight(passage: str, evidence: list[str]) -> tuple[str, list[str]]:
    """The passage as HTML (escaped, its math as MathML) with each evidence sentence found in it in <mark>.

    Returns the HTML and the evidence sentences not found in the passage (shown apart)."""
    text = passage or ""
    spans: list[tuple[int, int]] = []
    missing: list[str] = []
    for sentence in evidence or []:
        words = sentence.split()
        if not words:
            continue
        m = re.search(r"\s+".join(re.escape(w) for w in words), text)
        if m:
            spans.append(m.span())
        else:
            missing.append(sentence)
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and (start <= merged[-1][1] or text[merged[-1][1]:start].isspace()):  # one run
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    # A mark that would cut into a math span or a \textbf{...} grows to hold all of it.
    return latex.to_html(text, esc_emphasis, [(a, b) for a, b in merged],
                         ('<mark class="evidence">', "</mark>")), missing


def passage_body(src: Source) -> tuple[str, list[str]]:
    """The passage without the title line the index puts first, and the evidence that is not the title."""
    passage, title = src.passage or "", " ".join((src.title or "").split())
    first, _, rest = passage.lstrip().partition("\n")
    if title and " ".join(first.split()) == title and rest.strip():
        passage = rest.strip()
    evidence = [e for e in src.evidence or [] if " ".join(e.split()) != title]
    return passage, evidence


def _card(src: Source, turn: int | None = None, unsupported: set[int] | frozenset[int] = frozenset()) -> str:
    url = safe_url(src.url)
    title = html_math(src.title)
    if url:
        title = f'<a href="{esc(url)}" target="_blank" rel="noopener noreferrer">{title}</a>'
    authors = ", ".join(src.authors[:8]) + (" et al." if len(src.authors) > 8 else "")
    bad = src.cited and src.n in unsupported
    body, evidence = passage_body(src)
    passage, missing = highlight(body, evidence if src.cited else [])
    extra = "".join(f'<div class="src-evidence">Supporting sentence: <mark class="evidence">{html_math(s)}</mark></div>'
                    for s in missing)
    badge = f'<div class="badge-unsupported">⚠ citation {UNSUPPORTED}</div>' if bad else ""
    classes = "src-card" + ("" if src.cited else " src-uncited") + (" src-unsupported" if bad else "")
    return (f'<div class="{classes}" id="{_card_id(src.n, turn)}" data-n="{src.n}">'
            f'<div class="src-title">[{src.n}] {title}</div>'
            f'<div class="src-meta">{esc(authors or "authors unknown")} · {_scores(src)} · {esc(src.paper_id)}</div>{badge}'
            f'<div class="src-passage">{passage}</div>{extra}</div>')


SCORES_TIP = ("Retrieved #n: its place in the retrieval order, which follows the fused score of the keyword and "
              "meaning matches. cosine: meaning similarity of the passage to the question; keyword: its BM25 word "
              "match. Cited papers are listed in the order the answer cites them.")


def _scores(src: Source) -> str:
    """Where retrieval placed the paper and the numbers that placed it, each named (a cited paper's card
    follows the answer's order, so its rank is said, not implied)."""
    ranked = f"retrieved #{src.retrieval.rank} · " if src.retrieval is not None else ""
    return f'<span class="src-scores" title="{esc(SCORES_TIP)}">{ranked}{esc(src.scores_label())}</span>'


def render_sources(sources: list[Source] | None, turn: int | None = None, question: str | None = None,
                   unsupported: set[int] | frozenset[int] = frozenset()) -> str:
    if not sources:
        return '<div class="src-empty">Sources of the latest answer appear here.</div>'
    cited = [s for s in sources if s.cited]
    uncited = [s for s in sources if not s.cited]
    parts = [f'<div class="src-panel" data-turn="{turn or 0}"{map_attribute(sources, question)}>']
    if turn is not None:
        parts.append(f'<div class="src-turn">Sources for answer {turn}: <i>{_question(question or "")}</i></div>')
    parts.append(f'<div class="src-head">Cited papers ({len(cited)})</div>')
    parts += [_card(s, turn, unsupported) for s in cited] or ['<div class="src-meta">The answer cites no paper.</div>']
    if uncited:
        parts.append(f'<div class="src-head">Retrieved, not cited ({len(uncited)})</div>')
        parts += [_card(s, turn) for s in uncited]
    parts.append("</div>")
    return "".join(parts)


def render_turn_sources(answer: Answer, turn: int) -> str:
    return render_sources(answer.sources, turn, answer.question, _unsupported(answer))


def _question(question: str) -> str:
    return html_math(latex.shorten(question, 80))


def _note(turn: int, question: str, text: str) -> str:
    return (f'<div class="src-panel" data-turn="{turn}"><div class="src-turn">Answer {turn}: '
            f'<i>{_question(question)}</i></div><div class="src-empty">{esc(text)}</div></div>')


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

NO_LLM_NOTE = ("No language model is set up, so answers are sentences quoted word for word from the abstracts. "
               "To have a model write them, set RAG_LLM=local or OPENAI_BASE_URL (rag doctor explains how).")


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
        model = f"Answers are written by **{md_text(str(rag.settings.llm_model))}** ({md_text(backend)})."
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
    titles = ([t for t in titles if 12 <= len(t) <= EXAMPLE_TITLE_MAX] or
              [t for t in titles if 12 <= len(t) <= 90] or [short(t, 90) for t in titles])
    if not titles:
        return list(EXAMPLES)
    step = max(1, len(titles) // n)
    picked = titles[::step][:n]
    return [EXAMPLE_TEMPLATES[i % len(EXAMPLE_TEMPLATES)].format(t) for i, t in enumerate(picked)]


def parse_auth(value: Any) -> tuple[str, str] | None:
    """`user:password` -> (user, password); None or blank -> no login."""
    if value is None:
        return None
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    value = str(value).strip()
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user.strip() or not password:
        raise InputError("RAG_UI_AUTH must be user:password (both non-empty)")
    return user.strip(), password


def make_auth(pair: tuple[str, str]):
    """Gradio auth callable: constant-time comparison, and a pause before refusing."""
    user, password = pair

    async def check(username: str, given: str) -> bool:
        ok = hmac.compare_digest(username.encode(), user.encode()) & hmac.compare_digest(
            (given or "").encode(), password.encode())
        if not ok:
            await asyncio.sleep(LOGIN_FAIL_DELAY)
        return bool(ok)

    return check


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

    def respond(message: str, history: list[dict], chat: list[dict], turns: list[dict], k: float,
                mode: str | None, advanced: str | None = None):
        """One question; `mode` and `advanced` are the two retrieval radios (one of them is chosen)."""
        mode = advanced or mode or default_mode
        message = CONTROL_CHARS.sub(" ", message or "").strip()  # what is echoed is what is asked
        if not message:
            yield (gr.skip(),) * 6
            return
        turn = len(turns or []) + 1
        turns = list(turns or []) + [{"question": message, "sources": _note(turn, message, "Finding sources…")}]
        chat = list(chat or []) + [{"role": "user", "content": md_math(message)},
                                   {"role": "assistant", "content": CURSOR}]
        yield "", chat, history, turns[-1]["sources"], turns, pick_update(turns, turn)
        pieces: list[str] = []
        try:
            stream = rag.stream(message, k=int(k), mode=mode, history=list(history) or None)
            # Read in a thread, with a tick when nothing comes: Gradio closes this generator at a yield when
            # the page goes away, and closing it stops the model (it would otherwise finish the answer).
            for piece in read_in_thread(stream):
                if piece is None:
                    yield (gr.skip(),) * 6
                elif piece == "" and not pieces:  # sources found: say so while the model reads them
                    chat[-1] = {"role": "assistant", "content": f"*{reading_note(piece)}* {CURSOR}"}
                    yield gr.skip(), chat, gr.skip(), gr.skip(), gr.skip(), gr.skip()
                else:
                    pieces.append(piece)
                    # rendered as the final answer is (markers as text until the sources are known)
                    text = render_answer(shown_text("".join(pieces)), [])
                    chat[-1] = {"role": "assistant", "content": text + " " + CURSOR}
                    yield gr.skip(), chat, gr.skip(), gr.skip(), gr.skip(), gr.skip()
            answer = stream.answer
        except Exception as exc:  # a RagError says how to fix it; anything else is a bug: log it
            if not isinstance(exc, RagError):
                log.exception("answering %r failed", message)
            error = str(exc) or type(exc).__name__
            chat[-1] = {"role": "assistant", "content": f"⚠️ {md_text(error)}"}
            if pieces:  # a turn cut off mid-stream stays in the history, as far as it got
                history = list(history) + [{"role": "user", "content": message},
                                           {"role": "assistant", "content": "".join(pieces)}]
            turns[-1] = {**turns[-1], "sources": _note(turn, message, f"No sources: {error}")}
            yield gr.skip(), chat, history, turns[-1]["sources"], turns, gr.Radio(value=turn)
            return
        chat[-1] = {"role": "assistant", "content": render_reply(answer, turn)}
        history = list(history) + [{"role": "user", "content": message},
                                   {"role": "assistant", "content": answer.answer}]
        turns[-1] = {**turns[-1], "sources": render_turn_sources(answer, turn), "cited": cited_paper_ids(answer)}
        # the panel shows the new answer's sources, even if an earlier turn was picked meanwhile
        yield gr.skip(), chat, history, turns[-1]["sources"], turns, gr.Radio(value=turn)

    def export_citations(turns: list[dict]):
        """The download of the last answer's cited papers; hidden when it cites none (or failed)."""
        path = citations_file(rag, turns[-1].get("cited") or []) if turns else None
        return gr.DownloadButton(value=path, visible=path is not None)

    def show_turn(turn: int | None, turns: list[dict]):
        if not turn or not turns or not 1 <= int(turn) <= len(turns):
            return gr.skip()
        return turns[int(turn) - 1]["sources"]

    def select_message(turns: list[dict], evt: gr.SelectData):
        """A click on a message shows the sources of its turn (a user and an answer message each)."""
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
                # Math comes as MathML made on the server (md_math), not as KaTeX: KaTeX would take every
                # "$5 and $10" for math, and could not draw the sources panel. allow_tags=False: with
                # the default (True) Gradio shows tags it does not know, <math> among them, as text;
                # with False its sanitizer (still on) keeps MathML and removes what it does not allow.
                # The height leaves the question box, the examples and the options on the first screen
                # (measured in Chromium at 1280x720 and 1440x900: tests/test_ui.py).
                chatbot = gr.Chatbot(elem_id="chat", label="Chat", show_label=False, height=CHAT_HEIGHT,
                                     min_height=CHAT_MIN_HEIGHT, latex_delimiters=[], buttons=["copy"],
                                     feedback_options=None, sanitize_html=True, allow_tags=False,
                                     placeholder="Ask about the indexed ML papers.")
                msg = gr.Textbox(placeholder="Ask a question and press Enter", show_label=False,
                                 elem_id="question", max_lines=4, submit_btn=True)
                # The examples right under the box; a click asks the question (not only fills the box).
                with gr.Row(elem_id="examples", equal_height=True):
                    example_buttons = [gr.Button(q, size="sm", variant="secondary", elem_classes=["example-q"],
                                                 min_width=120) for q in examples]
                # Options weigh less than the examples: folded, one line until opened.
                with gr.Row(elem_id="options-row"):
                    with gr.Accordion(OPTIONS_LABEL, open=default_mode in advanced_modes, elem_id="options"):
                        with gr.Row():
                            k = gr.Slider(1, 20, value=rag.settings.top_k, step=1, label="Papers (k)", scale=1)
                            mode = gr.Radio(MODE_CHOICES, label="Find papers by", info=MODE_INFO, elem_id="mode",
                                            value=None if default_mode in advanced_modes else default_mode,
                                            scale=2)
                        # The fusion variants, folded away unless one of them is the configured default.
                        with gr.Accordion(ADVANCED_LABEL, open=default_mode in advanced_modes,
                                          elem_id="mode-advanced"):
                            advanced = gr.Radio(ADVANCED_MODE_CHOICES, show_label=False, elem_id="mode-fusion",
                                                value=default_mode if default_mode in advanced_modes else None)
                    clear = gr.Button("Clear", variant="secondary", elem_id="clear", size="sm", scale=0,
                                      min_width=80)
            # Sticky: the sources stay on screen however far the page scrolls (it scrolls inside itself).
            with gr.Column(scale=2, elem_id="side"), gr.Tabs(elem_id="side-tabs"):
                with gr.Tab("Sources", elem_id="tab-sources"):
                    pick = gr.Radio([], label="Sources for answer", elem_id="turn-pick", visible=False)
                    # Above the panel: the panel's cards can overflow its box onto whatever sits below it.
                    export = gr.DownloadButton(EXPORT_LABEL, visible=False, elem_id="export-bib", size="sm")
                    sources = gr.HTML(render_sources(None), elem_id="sources", label="Sources")
                if offers_map(rag):  # the papers' map (rag/ui/map_view.py); lit up from the panel shown
                    with gr.Tab("Map", elem_id="tab-map"):
                        gr.HTML(FRAME, elem_id="map-view")
        # A question sent while an answer streams is kept in the box and asked when that answer ends
        # (Gradio's default, trigger_mode="once", drops it).
        # An example button asks its own text (a Button's value is its label), the same way; the API keeps
        # one documented endpoint (/respond, the box's), and all of them share one concurrency limit.
        for trigger, question in [(msg.submit, msg)] + [(b.click, b) for b in example_buttons]:
            trigger(respond, [question, history, chatbot, turns, k, mode, advanced],
                    [msg, chatbot, history, sources, turns, pick], concurrency_limit=CONCURRENCY_LIMIT,
                    concurrency_id="respond", show_progress="hidden", trigger_mode="always_last",
                    api_visibility="public" if question is msg else "undocumented",
                    ).then(export_citations, [turns], export, concurrency_limit=CONCURRENCY_LIMIT,
                           show_progress="hidden")
            # The download always belongs to the answer shown last: hidden while the next one is coming.
            trigger(lambda: gr.DownloadButton(visible=False), None, export, queue=False, show_progress="hidden")
        pick.input(show_turn, [pick, turns], sources, queue=False, show_progress="hidden")
        # One retrieval mode at a time: a choice in either radio clears the other.
        mode.input(lambda: None, None, advanced, queue=False, show_progress="hidden")
        advanced.input(lambda: None, None, mode, queue=False, show_progress="hidden")
        chatbot.select(select_message, [turns], [sources, pick], queue=False, show_progress="hidden")

        def reset():
            return ([], [], [], render_sources(None), "", gr.Radio(choices=[], value=None, visible=False),
                    gr.DownloadButton(value=None, visible=False))

        outputs = [chatbot, history, turns, sources, msg, pick, export]
        clear.click(reset, None, outputs, queue=False)
        chatbot.clear(reset, None, outputs, queue=False)  # its own trash icon
        demo.load(lambda: header_text(rag), None, header, queue=False)
    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT)
    return demo


def launch(rag: RAG | None = None, host: str | None = None, port: int | None = None,
           block: bool = True, auth: str | None = None, login_throttle: LoginThrottle | None = None) -> gr.Blocks:
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
        log.warning("the UI listens on %s without a login: anyone who can reach it can use it "
                    "(set RAG_UI_AUTH=user:password)", host)
    demo = build_app(rag)
    throttle = login_throttle or LoginThrottle()
    map_pages = MapPages(rag) if offers_map(rag) else None
    # The login form shows nothing for a 429: the page says the rule up front instead.
    auth_message = (f"Paper chat: log in with the RAG_UI_AUTH user and password. After {throttle.attempts} failed "
                    f"tries, wait {throttle.window:g} s before trying again.")
    theme = gr.themes.Soft(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    # share=False: no public tunnel even if GRADIO_SHARE is set. quiet=True: Gradio's banner tells
    # a CLI user to "set share=True in launch()"; the one line printed below says what they need.
    # max_file_size: a second bound on uploads, which RouteGate already refuses.
    # X-Forwarded-For is not taken as the client's address (the login throttle's key) unless configured.
    with _forwarded_for_trusted_only_when_configured():
        demo.launch(server_name=host, server_port=port or rag.settings.ui_port, share=False,
                    auth=make_auth(pair) if pair else None,
                    auth_message=auth_message if pair else None,
                    app_kwargs={"middleware": [Middleware(CSPMiddleware),  # outermost: headers on every answer
                                               Middleware(RouteGate, throttle=throttle, map_pages=map_pages)]},
                    ssr_mode=False, max_file_size="1kb",
                    prevent_thread_lock=True, theme=theme, css=CSS, head=HEAD_SCRIPT, footer_links=[],
                    run_history=False, enable_monitoring=False, mcp_server=False, pwa=False,
                    show_error=True, quiet=True)
    if map_pages is not None:
        map_pages.start()  # laid out while the first question is typed
    if block:
        print(f"Paper chat on {demo.local_url} (Ctrl+C stops it)", flush=True)
        demo.block_thread()
    return demo


@contextlib.contextmanager
def _forwarded_for_trusted_only_when_configured() -> Iterator[None]:
    """uvicorn, under Gradio, takes a loopback client's X-Forwarded-For as its address unless told otherwise:
    anyone on this host could rotate it past the login throttle. While Gradio builds its uvicorn config the
    header is trusted from nobody, unless FORWARDED_ALLOW_IPS names a proxy (uvicorn's setting, kept as is)."""
    if "FORWARDED_ALLOW_IPS" in os.environ:
        yield
        return
    os.environ["FORWARDED_ALLOW_IPS"] = ""
    try:
        yield
    finally:
        os.environ.pop("FORWARDED_ALLOW_IPS", None)


if __name__ == "__main__":
    launch()
