"""A Gradio chat over the paper store: streamed answers with linked [n] citations and a sources panel.

Everything shown that comes from the corpus or a model is HTML-escaped (and markdown links/images are
neutralised in the chat), and every response carries a Content-Security-Policy so nothing remote -
images, scripts, fonts - can load even if some markup slipped through.
"""

from __future__ import annotations

import html
import logging
import re
from typing import TYPE_CHECKING, Any

import gradio as gr
from starlette.middleware import Middleware

from rag.config import RETRIEVAL_MODES
from rag.errors import RagError

if TYPE_CHECKING:
    from rag import RAG
    from rag.models import Answer, Source

log = logging.getLogger(__name__)
CONCURRENCY_LIMIT = 16
EXAMPLES = [
    "How does Palimpsa relate to Mamba2?",
    "Which papers study backdoor attacks on language models?",
    "How can a Bayesian optimization run decide when to stop?",
]
CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval'",  # Gradio's page has inline bootstrap scripts
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "media-src 'self' data: blob:",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'self'",
])
CSS = """
#sources { max-height: 640px; overflow-y: auto; }
.src-card { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 8px 10px; margin: 6px 0; }
.src-card:target { border-color: var(--color-accent); box-shadow: 0 0 0 2px var(--color-accent-soft); }
.src-title { font-weight: 600; } .src-meta { font-size: 0.85em; opacity: 0.8; }
.src-passage { font-size: 0.9em; margin-top: 4px; white-space: pre-wrap; }
.src-uncited { opacity: 0.75; } .src-head { font-weight: 600; margin: 10px 0 2px; }
#chat a.cite { color: var(--color-accent); text-decoration: none; font-weight: 600; }
"""

_MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_MD_SPECIAL = re.compile(r"([\\`\[\]$<>])")  # no [ ]: no links or images; no code spans, math


class CSPMiddleware:
    """Pure ASGI middleware (safe for streaming responses) adding the CSP and nosniff headers."""

    def __init__(self, app: Any, policy: str = CSP) -> None:
        self.app, self.policy = app, policy.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"content-security-policy"]
                headers += [(b"content-security-policy", self.policy),
                            (b"x-content-type-options", b"nosniff")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def esc(text: Any) -> str:
    """Plain text -> safe for an HTML context."""
    return html.escape("" if text is None else str(text), quote=True)


def md_text(text: str) -> str:
    """Plain text -> chat markdown that renders as that text: no HTML, links, images, code or math."""
    return _MD_SPECIAL.sub(r"\\\1", esc(text))


def safe_url(url: str | None) -> str | None:
    return url if url and re.match(r"https?://", url, re.I) else None


def _cite_link(n: int, by_n: dict[int, Source]) -> str:
    src = by_n.get(n)
    if src is None:
        return f"\\[{n}\\]"
    href = safe_url(src.url) or f"#src-{n}"
    target = ' target="_blank" rel="noopener noreferrer"' if safe_url(src.url) else ""
    return f'<a class="cite" href="{esc(href)}" title="{esc(src.title)}"{target}>[{n}]</a>'


def render_answer(text: str, sources: list[Source]) -> str:
    """Answer text -> chat markdown with every [n] (or [n, m]) marker linked to its paper."""
    by_n = {s.n: s for s in sources}
    out, pos = [], 0
    for m in _MARKER.finditer(text):
        out.append(md_text(text[pos:m.start()]))
        out.append("".join(_cite_link(int(n), by_n) for n in m.group(1).split(",")))
        pos = m.end()
    out.append(md_text(text[pos:]))
    return "".join(out)


def render_reply(answer: Answer) -> str:
    body = render_answer(answer.answer, answer.sources)
    notes = []  # the library's extractive answers already say they are quotes
    if answer.error:
        notes.append(f"LLM failed: {md_text(answer.error)}")
    if answer.grounding is not None and answer.mode == "llm":
        notes.append(f"grounding {answer.grounding:.0%}")
    return body + (f"\n\n<sub>{' · '.join(notes)}</sub>" if notes else "")


def _card(src: Source) -> str:
    url = safe_url(src.url)
    title = esc(src.title)
    if url:
        title = f'<a href="{esc(url)}" target="_blank" rel="noopener noreferrer">{title}</a>'
    authors = ", ".join(src.authors[:8]) + (" et al." if len(src.authors) > 8 else "")
    return (f'<div class="src-card{"" if src.cited else " src-uncited"}" id="src-{src.n}">'
            f'<div class="src-title">[{src.n}] {title}</div>'
            f'<div class="src-meta">{esc(authors or "authors unknown")} · score {src.score:.2f}'
            f' · {esc(src.paper_id)}</div>'
            f'<div class="src-passage">{esc(src.passage)}</div></div>')


def render_sources(sources: list[Source] | None) -> str:
    if not sources:
        return '<div class="src-empty">Sources of the latest answer appear here.</div>'
    cited = [s for s in sources if s.cited]
    uncited = [s for s in sources if not s.cited]
    parts = [f'<div class="src-head">Cited papers ({len(cited)})</div>']
    parts += [_card(s) for s in cited] or ['<div class="src-meta">The answer cites no paper.</div>']
    if uncited:
        parts.append(f'<div class="src-head">Retrieved, not cited ({len(uncited)})</div>')
        parts += [_card(s) for s in uncited]
    return "".join(parts)


def header_text(rag: RAG) -> str:
    try:
        papers = rag.stats().get("papers", "?")
    except Exception as exc:  # an unreadable store should not take the page down
        papers = f"? ({type(exc).__name__})"
    backend = rag.settings.llm_backend
    model = "extractive: no LLM configured" if backend == "none" else f"{backend}: {rag.settings.llm_model}"
    return f"### Paper chat\n**{md_text(str(papers))}** papers indexed · model **{md_text(model)}**"


def build_app(rag: RAG) -> gr.Blocks:
    """The chat page for one shared, thread-safe `RAG`; chat history lives in per-session state."""

    def respond(message: str, history: list[dict], chat: list[dict], k: float, mode: str):
        message = (message or "").strip()
        if not message:
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        chat = list(chat or []) + [{"role": "user", "content": md_text(message)},
                                   {"role": "assistant", "content": "▌"}]
        yield "", chat, history, gr.skip()
        answer, pieces = None, []
        try:
            for item in rag.stream(message, k=int(k), mode=mode, history=list(history) or None):
                if isinstance(item, str):
                    pieces.append(item)
                    chat[-1] = {"role": "assistant", "content": md_text("".join(pieces)) + " ▌"}
                    yield gr.skip(), chat, gr.skip(), gr.skip()
                else:
                    answer = item
        except Exception as exc:  # a RagError says how to fix it; anything else is a bug: log it
            if not isinstance(exc, RagError):
                log.exception("answering %r failed", message)
            chat[-1] = {"role": "assistant", "content": f"⚠️ {md_text(str(exc) or type(exc).__name__)}"}
            if pieces:  # a turn cut off mid-stream stays in the history, as far as it got
                history = list(history) + [{"role": "user", "content": message},
                                           {"role": "assistant", "content": "".join(pieces)}]
            yield gr.skip(), chat, history, gr.skip()
            return
        if answer is None:
            chat[-1] = {"role": "assistant", "content": "⚠️ No answer was produced."}
            yield gr.skip(), chat, history, gr.skip()
            return
        chat[-1] = {"role": "assistant", "content": render_reply(answer)}
        history = list(history) + [{"role": "user", "content": message},
                                   {"role": "assistant", "content": answer.answer}]
        yield gr.skip(), chat, history, render_sources(answer.sources)

    with gr.Blocks(title="Paper chat", analytics_enabled=False, fill_width=True) as demo:
        header = gr.Markdown(header_text(rag), elem_id="header")
        history = gr.State([])  # raw text turns for rag.stream(history=...); per browser session
        with gr.Row():
            with gr.Column(scale=3):
                chatbot = gr.Chatbot(elem_id="chat", label="Chat", height=560, latex_delimiters=[], buttons=["copy"],
                                     feedback_options=None, sanitize_html=True,
                                     placeholder="Ask about the indexed ML papers.")
                msg = gr.Textbox(placeholder="Ask a question and press Enter", show_label=False,
                                 elem_id="question", max_lines=4, submit_btn=True)
                with gr.Row():
                    k = gr.Slider(1, 20, value=rag.settings.top_k, step=1, label="Papers (k)")
                    mode = gr.Radio(list(RETRIEVAL_MODES), value=rag.settings.mode, label="Retrieval")
                    clear = gr.Button("Clear", variant="secondary", elem_id="clear")
                gr.Examples(EXAMPLES, inputs=msg, label="Examples")
            with gr.Column(scale=2):
                sources = gr.HTML(render_sources(None), elem_id="sources", label="Sources")
        msg.submit(respond, [msg, history, chatbot, k, mode], [msg, chatbot, history, sources],
                   concurrency_limit=CONCURRENCY_LIMIT, show_progress="hidden")
        reset = lambda: ([], [], render_sources(None), "")  # noqa: E731
        clear.click(reset, None, [chatbot, history, sources, msg], queue=False)
        chatbot.clear(reset, None, [chatbot, history, sources, msg], queue=False)  # its own trash icon
        demo.load(lambda: header_text(rag), None, header, queue=False)
    demo.queue(default_concurrency_limit=CONCURRENCY_LIMIT)
    return demo


def launch(rag: RAG | None = None, host: str | None = None, port: int | None = None,
           block: bool = True) -> gr.Blocks:
    """Serve the UI; host/port default to `rag.settings.ui_host`/`ui_port` (127.0.0.1:7860).

    With `block=False` the server runs in a background thread; call `.close()` on the result.
    """
    if rag is None:
        from rag import RAG as _RAG
        rag = _RAG()
    demo = build_app(rag)
    theme = gr.themes.Soft(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    demo.launch(server_name=host or rag.settings.ui_host, server_port=port or rag.settings.ui_port,
                app_kwargs={"middleware": [Middleware(CSPMiddleware)]}, ssr_mode=False,
                prevent_thread_lock=not block, theme=theme, css=CSS, footer_links=[],
                show_error=True, quiet=not block)
    return demo


if __name__ == "__main__":
    launch()
