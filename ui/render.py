"""Answers as the chat page shows them: chat markdown for the messages, HTML for the sources panel.

Pure functions of an `Answer` (no Gradio): everything from the corpus or a model is escaped,
markdown links and images are neutralised, and LaTeX shows as whitelisted MathML or plain text
(`rag.latex`). `render_reply` links the `[n]` markers and appends the answer's own references,
`md_answer` draws the answer's text, `render_sources` the cards of the panel.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

from rag import latex
from rag.markers import MARKER, parse_markers, plain_text
from rag.prompts import ABSTAIN_ANSWER, REFUSAL

from .map_view import map_attribute

if TYPE_CHECKING:
    from rag.models import Answer, Reading, Source, Writing

READING = "Reading the sources…"
WRITING = "Writing the answer…"
UNSUPPORTED = "not supported by the passage it cites"
# The library says the nearest papers are "listed as sources"; the page says where that is.
UI_ABSTAIN = REFUSAL + " The nearest papers are listed in the Sources panel on the right."

_MD_SPECIAL = re.compile(r"([\\`\[\]$<>*_~])")  # no links, images, code spans, math, emphasis
_AUTOLINK = re.compile(r"://|(?<![\w.])www\.|@", re.I)
_AUTOLINK_BREAK = {
    "/": lambda s: "&#58;//",
    ".": lambda s: s[:-1] + "&#46;",
    "@": lambda s: "&#64;",
}


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
    """Plain text -> chat markdown, as `md_text`, but with the markdown emphasis a model or an
    abstract writes (`**Name**`, `*not*`) drawn as <strong>/<em> around escaped text, as the
    sources panel draws it (`esc_emphasis`). Underscores and ~~ stay as written."""
    out, pos = [], 0
    for m in _MD_EMPHASIS.finditer(text):
        bold, italic = m.group(1), m.group(2)
        out.append(md_text(text[pos : m.start()]))
        out.append(
            f"<strong>{md_text(bold)}</strong>"
            if bold is not None
            else f"<em>{md_text(italic)}</em>"
        )
        pos = m.end()
    out.append(md_text(text[pos:]))
    return "".join(out)


def md_answer(text: str) -> str:
    """A model's (or the extractive) answer text -> chat markdown: LaTeX as the sources panel shows
    it (math as MathML, `95\\%` as "95%", `\\textbf{x}` bold) and markdown emphasis drawn; nothing
    else becomes markup."""
    return latex.to_html(text, md_emphasis)


def esc_emphasis(text: str) -> str:
    """Plain text -> HTML, escaped, with the markdown emphasis abstracts carry
    (`**F**unction-**I**nformed`) drawn as emphasis instead of shown as asterisks. Only <strong> and
    <em> are made, around escaped text."""
    return _MD_ITALIC.sub(r"<em>\1</em>", _MD_BOLD.sub(r"<strong>\1</strong>", esc(text)))


def html_math(text: str) -> str:
    """Text that may hold LaTeX -> HTML for the sources panel: math as MathML, the rest escaped (a
    title's asterisks stay as written; passages draw their emphasis: `highlight`)."""
    return latex.to_html(text, esc)


def safe_url(url: str | None) -> str | None:
    return url if url and re.match(r"https?://", url, re.I) else None


# ---------------------------------------------------------------- the answer in the chat


def _card_id(n: int, turn: int | None) -> str:
    return f"src-{turn}-{n}" if turn is not None else f"src-{n}"


def _unsupported(answer: Answer) -> set[int]:
    return {c.n for c in answer.citations if c.supported is False}


def _cite_link(
    n: int, by_n: dict[int, Source], turn: int | None, unsupported: set[int] | frozenset[int]
) -> str:
    src = by_n.get(n)
    if src is None:
        return f"\\[{n}\\]"
    # To the paper's card in the Sources panel (static/cites.js), not away from the chat: the card
    # holds the passage and the supporting sentences, and its title links to the paper.
    href = f"#{_card_id(n, turn)}"
    if n in unsupported:
        return (
            f'<a class="cite unsupported" href="{esc(href)}" title="{esc(latex.to_text(src.title))}'
            f' ({UNSUPPORTED})">[{n}]</a><span class="flag-unsupported"'
            f' title="{UNSUPPORTED}">⚠</span>'
        )
    return f'<a class="cite" href="{esc(href)}" title="{esc(latex.to_text(src.title))}">[{n}]</a>'


def render_answer(
    text: str,
    sources: list[Source],
    turn: int | None = None,
    unsupported: set[int] | frozenset[int] = frozenset(),
) -> str:
    """Answer text -> chat markdown with every [n] (or [n, m]) marker linked to its paper, math as
    math."""
    by_n = {s.n: s for s in sources}
    out, pos = [], 0
    for m in MARKER.finditer(text):
        out.append(md_answer(plain_text(text[pos : m.start()])))
        out.append(
            "".join(
                _cite_link(n, by_n, turn, unsupported)
                for n in dict.fromkeys(parse_markers(m.group()))
            )
        )
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
        title = (
            f'<a class="ref" href="{esc(url)}" target="_blank" rel="noopener'
            f' noreferrer">{title}</a>'
            if url
            else title
        )
        flag = (
            f' <span class="flag-unsupported">⚠ {UNSUPPORTED}</span>' if s.n in unsupported else ""
        )
        lines.append(f"\\[{s.n}\\] {title}{flag}")
    return "**References**  \n" + "  \n".join(lines)


def reading_note(piece: Reading) -> str:
    """The line shown while the model reads the sources, with the engine's estimate when it has
    one."""
    if not piece.seconds:
        return f"{READING} (a model on a CPU takes a few seconds before it writes)"
    return f"{READING} about {piece.seconds:.0f} s, then the answer is written and checked"


def writing_note(piece: Writing) -> str:
    """The line shown while the model writes: its answer shows once checked, whole."""
    return f"{WRITING} ({piece.tokens} tokens so far; it shows once checked)"


def shown_text(text: str) -> str:
    """The answer text as the page shows it: an abstention says where the nearest papers are."""
    return text.replace(ABSTAIN_ANSWER, UI_ABSTAIN)


def render_reply(answer: Answer, turn: int | None = None) -> str:
    """The final chat message of a turn: error line, linked answer, grounding, references."""
    parts = []
    if answer.error:  # the library's fallback answer follows, with the sources
        parts.append(f"⚠️ **LLM failed:** {md_text(answer.error)}")
    parts.append(
        render_answer(shown_text(answer.answer), answer.sources, turn, _unsupported(answer))
    )
    if answer.mode == "llm" and not answer.abstained:
        notes = []
        if answer.grounding is not None:
            notes.append(
                "every claim is backed by the passage it cites"
                if answer.grounding >= 1
                else f"{answer.grounding:.0%} of the claims are backed by the passages they cite"
            )
        uncited = len(getattr(answer, "uncited_sentences", None) or [])
        if not answer.citations:
            notes.append("⚠ this answer cites no paper: check it against the sources")
        elif uncited:
            notes.append(
                f"⚠ {uncited} sentence{'s' if uncited > 1 else ''} cite{'' if uncited > 1 else 's'}"
                " no paper"
            )
        if notes:
            parts.append(f"<sub>{' · '.join(notes)}</sub>")
    refs = render_references(answer, turn)
    if refs:
        parts.append(refs)
    return "\n\n".join(parts)


# ---------------------------------------------------------------- the sources panel


def highlight(passage: str, evidence: list[str]) -> tuple[str, list[str]]:
    """The passage as HTML (escaped, its math as MathML) with each evidence sentence found in it in
    <mark>.

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
        if merged and (start <= merged[-1][1] or text[merged[-1][1] : start].isspace()):  # one run
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    # A mark that would cut into a math span or a \textbf{...} grows to hold all of it.
    return latex.to_html(
        text, esc_emphasis, [(a, b) for a, b in merged], ('<mark class="evidence">', "</mark>")
    ), missing


def passage_body(src: Source) -> tuple[str, list[str]]:
    """The passage without the title line the index puts first, and the evidence that is not the
    title."""
    passage, title = src.passage or "", " ".join((src.title or "").split())
    first, _, rest = passage.lstrip().partition("\n")
    if title and " ".join(first.split()) == title and rest.strip():
        passage = rest.strip()
    evidence = [e for e in src.evidence or [] if " ".join(e.split()) != title]
    return passage, evidence


def _card(
    src: Source, turn: int | None = None, unsupported: set[int] | frozenset[int] = frozenset()
) -> str:
    url = safe_url(src.url)
    title = html_math(src.title)
    if url:
        title = f'<a href="{esc(url)}" target="_blank" rel="noopener noreferrer">{title}</a>'
    authors = ", ".join(src.authors[:8]) + (" et al." if len(src.authors) > 8 else "")
    bad = src.cited and src.n in unsupported
    body, evidence = passage_body(src)
    passage, missing = highlight(body, evidence if src.cited else [])
    extra = "".join(
        '<div class="src-evidence">Supporting sentence: <mark'
        f' class="evidence">{html_math(s)}</mark></div>'
        for s in missing
    )
    badge = f'<div class="badge-unsupported">⚠ citation {UNSUPPORTED}</div>' if bad else ""
    classes = (
        "src-card" + ("" if src.cited else " src-uncited") + (" src-unsupported" if bad else "")
    )
    return (
        f'<div class="{classes}" id="{_card_id(src.n, turn)}" data-n="{src.n}"><div'
        f' class="src-title">[{src.n}] {title}</div><div'
        f' class="src-meta">{esc(authors or "authors unknown")} · {_place(src)}'
        f" {esc(src.paper_id)}</div>{badge}<div"
        f' class="src-passage">{passage}</div>{extra}{_scores(src)}</div>'
    )


def _place(src: Source) -> str:
    """Where retrieval put the paper, in words ("the best match · "): a cited paper's card follows
    the answer's order, so its place is said, not implied."""
    if src.retrieval is None:
        return ""
    rank = src.retrieval.rank
    ordinal = {1: "", 2: "2nd ", 3: "3rd "}.get(rank, f"{rank}th ")
    return f"the {ordinal}best match ·"


SCORES_TIP = (
    "Retrieved #n: its place in the retrieval order, which follows the fused score of the keyword"
    " and meaning matches. cosine: meaning similarity of the passage to the question; keyword: its"
    " BM25 word match. Cited papers are listed in the order the answer cites them."
)


def _scores(src: Source) -> str:
    """The numbers that placed the paper, each named, behind a disclosure ("how it matched"): a
    reader needs the place, a curious one the numbers."""
    ranked = f"retrieved #{src.retrieval.rank} · " if src.retrieval is not None else ""
    return (
        '<details class="src-details"><summary>how it matched</summary><span class="src-scores"'
        f' title="{esc(SCORES_TIP)}">{ranked}{esc(src.scores_label())}</span></details>'
    )


def render_sources(
    sources: list[Source] | None,
    turn: int | None = None,
    question: str | None = None,
    unsupported: set[int] | frozenset[int] = frozenset(),
) -> str:
    if not sources:
        return '<div class="src-empty">Sources of the latest answer appear here.</div>'
    cited = [s for s in sources if s.cited]
    uncited = [s for s in sources if not s.cited]
    parts = [f'<div class="src-panel" data-turn="{turn or 0}"{map_attribute(sources, question)}>']
    if turn is not None:
        parts.append(
            f'<div class="src-turn">Sources for answer {turn}:'
            f" <i>{_question(question or '')}</i></div>"
        )
    parts.append(f'<div class="src-head">Cited papers ({len(cited)})</div>')
    parts += [_card(s, turn, unsupported) for s in cited] or [
        '<div class="src-meta">The answer cites no paper.</div>'
    ]
    if uncited:
        parts.append(f'<div class="src-head">Retrieved, not cited ({len(uncited)})</div>')
        parts += [_card(s, turn) for s in uncited]
    parts.append("</div>")
    return "".join(parts)


def render_found(papers: list[Source], turn: int, question: str) -> str:
    """The Sources panel while the model reads: the papers found, before any is cited."""
    if not papers:
        return render_note(turn, question, "No papers found.")
    return "".join(
        [
            f'<div class="src-panel" data-turn="{turn}"{map_attribute(papers, question)}>',
            f'<div class="src-turn">Sources for answer {turn}: <i>{_question(question)}</i></div>',
            f'<div class="src-head">Papers found ({len(papers)}); the model is reading them</div>',
            *(_card(s, turn) for s in papers),
            "</div>",
        ]
    )


def render_turn_sources(answer: Answer, turn: int) -> str:
    return render_sources(answer.sources, turn, answer.question, _unsupported(answer))


def _question(question: str) -> str:
    return html_math(latex.shorten(question, 80))


def render_note(turn: int, question: str, text: str) -> str:
    return (
        f'<div class="src-panel" data-turn="{turn}"><div class="src-turn">Answer {turn}: '
        f'<i>{_question(question)}</i></div><div class="src-empty">{esc(text)}</div></div>'
    )
