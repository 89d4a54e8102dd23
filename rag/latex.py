"""The LaTeX of titles, abstracts and answers, shown as math: safe HTML (MathML) or readable text.

`to_html` turns math spans into MathML (browsers draw MathML Core natively: nothing to load) and the
text commands (`\\emph{...}`, `\\textbf{...}`) into markup, every other character going through the
caller's escaper; `to_text` gives the Unicode reading (`$\\mathcal{O}(n \\log n)$` -> "𝒪(n log n)")
for places that take no markup. The text is untrusted, so the MathML is rebuilt from a whitelist of
elements and attributes; a span outside it, and a `$` that reads as a price, stays text.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from xml.etree import ElementTree

MAX_MATH = 400  # characters of one math span; a longer "span" is two prices or a stray dollar
MAX_DEPTH = 4  # text commands nested deeper are shown as written

TEXT, MATH, CHAR, COMMAND = "text", "math", "char", "command"

# Text commands shown as what they mean; the argument's own LaTeX is converted too (`\textbf{$\sim$
# 3%}`).
_WRAP = {
    "emph": "em",
    "textit": "em",
    "textsl": "em",
    "textbf": "strong",
    "underline": "u",
    "texttt": "code",
}
_PLAIN = {
    "text",
    "textrm",
    "textsf",
    "textsc",
    "textup",
    "textmd",
    "textnormal",
    "mbox",
    "url",
    "href",
}

_SCAN = re.compile(
    r"""
    (?P<bs>\\\\)                              # a LaTeX line break: text
  | \\(?P<esc>[%&$\#_{}])                     # an escaped character
  | \\(?P<cmd>[A-Za-z]+)(?=\s*\{)             # a command with an argument
  | (?P<paren>\\\()                           # \( inline math \)
  | (?P<dollars>\$\$?)
""",
    re.X,
)
_BRACE = re.compile(r"\\.|[{}]", re.S)
_OPEN = re.compile(r"\s*\{")
# Prose inside a dollar pair: two words in a row outside commands and {groups}.
_GROUP = re.compile(r"\{[^{}]*\}")
_ARGUMENTS = re.compile(r"\\[A-Za-z]+")
# two words ("one\\ word" is math)
_PROSE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}[ \t\r\n]+[A-Za-z]{3,}")
_PRICE = re.compile(r"\s*\d[\d.,]*\s+[A-Za-z]{3,}")

# MathML written back: MathML Core elements (and menclose/mstyle, which Chromium shows as their
# content) that Gradio's chat sanitizer also keeps. Anything else makes the span text.
_ELEMENTS = frozenset(
    """math mrow mi mn mo ms mtext mspace msup msub msubsup mfrac msqrt mroot mover munder
    munderover mtable mtr mtd mstyle mpadded mphantom menclose merror""".split()
)
_BOOL = re.compile(r"true|false")
_LENGTH = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:em|ex|px|pt|mu|%)?")
_WORDS = re.compile(r"[a-z]+(?: [a-z]+){0,15}")
_ATTRIBUTES: dict[str, re.Pattern[str]] = {
    "display": re.compile(r"inline|block"),
    "mathvariant": re.compile(
        r"normal|bold|italic|bold-italic|double-struck|script|bold-script|fraktur|"
        r"bold-fraktur|sans-serif|bold-sans-serif|sans-serif-italic|"
        r"sans-serif-bold-italic|monospace"
    ),
    "form": re.compile(r"prefix|infix|postfix"),
    **{
        name: _BOOL
        for name in (
            "stretchy",
            "fence",
            "separator",
            "accent",
            "accentunder",
            "largeop",
            "movablelimits",
            "symmetric",
            "displaystyle",
        )
    },
    **{
        name: _LENGTH
        for name in (
            "lspace",
            "rspace",
            "width",
            "height",
            "depth",
            "voffset",
            "minsize",
            "maxsize",
            "linethickness",
        )
    },
    "scriptlevel": re.compile(r"[+-]?\d"),
    **{name: _WORDS for name in ("columnalign", "rowalign", "columnlines", "rowlines", "notation")},
}
_NS = "{http://www.w3.org/1998/Math/MathML}"
_FUNCTION = re.compile(r"[A-Za-z]{2,}")
_SAFE_CHAR = re.compile(r"[A-Za-z0-9 ]")

# Unicode super- and subscripts for the fallback text (`R^2` -> "R²").
_SUP = dict(zip("0123456789+-=()n", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿ"))
_SUB = dict(zip("0123456789+-=()", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎"))
# Commands whose first argument is no content (a URL, a colour, a style): dropped from the text.
_NOT_CONTENT = re.compile(
    r"\\(?:href|style|class|color|textcolor|colorbox|fcolorbox|htmlClass|htmlId|htmlStyle|"
    r"htmlData|cssId)\s*\{[^{}]*\}"
)
_MACRO = re.compile(r"\\([A-Za-z]+)(?![A-Za-z]|\s*\{)")
_TEXT_ARGUMENT = re.compile(
    r"\\(?:" + "|".join(sorted((_WRAP.keys() | _PLAIN) - {"href", "url"})) + r")\s*\{([^{}]*)\}"
)
_ESCAPED = re.compile(r"\\[%&#_$]")
# Declarations and sizes that change how math looks, not what it says: dropped from the text.
_STYLE = re.compile(
    r"\\(?:bf|it|rm|sf|tt|em|sc|sl|cal|bfseries|itshape|rmfamily|sffamily|ttfamily|upshape|mdseries|"
    r"normalfont|displaystyle|textstyle|scriptstyle|scriptscriptstyle|left|right|middle|"
    r"[bB]igg?[lrm]?|limits|nolimits)(?![A-Za-z])"
)
_SCRIPT = re.compile(r"([\^_])(?:\{\s*([^{}]{1,12}?)\s*\}|([0-9]))")


@dataclass
class Piece:
    """A run of the text: plain text, a math span, an escaped character or a text command."""

    kind: str
    start: int
    end: int
    value: str = ""  # the math's LaTeX, the character, or the command's name
    display: bool = False  # math: $$...$$
    inner: list[Piece] = field(default_factory=list)  # a command's argument, parsed
    literal: str = ""  # a URL command's argument, as written


def parse(text: str) -> list[Piece]:
    """The text as pieces, in order, covering it whole (in time linear in its length)."""
    return _parse(text, 0, len(text), 0, _braces(text))


def _braces(text: str) -> dict[int, int]:
    """Where each `{` is closed (escaped braces are text): one pass, so unclosed groups cost
    nothing."""
    pairs: dict[int, int] = {}
    opened: list[int] = []
    for m in _BRACE.finditer(text):
        if m.group() == "{":
            opened.append(m.start())
        elif m.group() == "}" and opened:
            pairs[opened.pop()] = m.start()
    return pairs


def _parse(text: str, start: int, end: int, depth: int, braces: dict[int, int]) -> list[Piece]:
    pieces: list[Piece] = []
    pos = text_start = start
    while (m := _SCAN.search(text, pos, end)) is not None:
        piece = None
        if m["esc"]:
            piece = Piece(CHAR, m.start(), m.end(), m["esc"])
        elif m["cmd"]:
            piece = _command(text, m, end, depth, braces)
        elif m["paren"]:
            close = text.find("\\)", m.end(), min(end, m.end() + MAX_MATH + 2))
            if close > m.end() and _fits(text[m.end() : close]):
                piece = Piece(MATH, m.start(), close + 2, text[m.end() : close])
        elif m["dollars"] == "$$":
            close = text.find("$$", m.end(), min(end, m.end() + MAX_MATH + 2))
            if close > m.end() and _fits(text[m.end() : close]):
                piece = Piece(MATH, m.start(), close + 2, text[m.end() : close], display=True)
        elif m["dollars"]:
            piece = _dollar_math(text, m.start(), end)
        if piece is None:
            pos = m.end()
            continue
        if text_start < piece.start:
            pieces.append(Piece(TEXT, text_start, piece.start))
        pieces.append(piece)
        pos = text_start = piece.end
    if text_start < end:
        pieces.append(Piece(TEXT, text_start, end))
    return pieces


def _fits(latex: str) -> bool:
    return bool(latex.strip()) and len(latex) <= MAX_MATH and not re.search(r"\n\s*\n", latex)


def _dollar_math(text: str, i: int, end: int) -> Piece | None:
    """The math span opened by the `$` at i, or None when that `$` is text (a price, a stray
    one)."""
    j = i + 1
    while True:
        j = text.find("$", j, min(end, i + MAX_MATH + 2))
        if j < 0:
            return None
        if text[j - 1] != "\\":
            break
        j += 1
    latex = text[i + 1 : j]
    if not _fits(latex):
        return None
    # "$5 and $10", "$5-$10"
    if latex[0].isdigit() and (latex[-1].isspace() or text[j + 1 : j + 2].isdigit()):
        return None
    words = _ARGUMENTS.sub(" ", _without_groups(latex))
    if _PROSE.search(words) or _PRICE.match(words):  # "$5, which costs $", "$ 5 per day $"
        return None
    return Piece(MATH, i, j + 1, latex)


def _without_groups(latex: str) -> str:
    """The LaTeX without its {groups} (a command's argument is no prose), innermost first."""
    while True:
        stripped = _GROUP.sub(" ", latex)
        if stripped == latex:
            return latex
        latex = stripped


def _command(
    text: str, m: re.Match[str], end: int, depth: int, braces: dict[int, int]
) -> Piece | None:
    name = m["cmd"]
    if (name not in _WRAP and name not in _PLAIN) or depth >= MAX_DEPTH:
        return None
    first = text.index("{", m.end())
    close = braces.get(first, end)
    if close >= end:  # unclosed, or closed outside the text being parsed
        return None
    arg_start, arg_end = first + 1, close
    if name == "href":  # \href{url}{text}: the text
        second = _OPEN.match(text, close + 1, end)
        last = braces.get(second.end() - 1, end) if second else end
        if second is None or last >= end:
            return None
        arg_start, arg_end, close = second.end(), last, last
    piece = Piece(COMMAND, m.start(), close + 1, name)
    if name == "url":
        piece.literal = text[arg_start:arg_end]
    else:
        piece.inner = _parse(text, arg_start, arg_end, depth + 1, braces)
    return piece


# ---------------------------------------------------------------- math


@lru_cache(maxsize=4096)
def math_html(latex: str, display: bool = False) -> str | None:
    """One math span as whitelisted MathML, or None when it cannot be shown as math safely."""
    try:
        raw = _latex2mathml(latex, display)
        if "<!" in raw or "<?" in raw:  # no declarations, entities or processing instructions
            return None
        root = ElementTree.fromstring(raw)
    except Exception:  # latex2mathml's many errors for bad LaTeX, a parse error, a recursion limit
        return None
    out: list[str] = []
    return "".join(out) if _write(root, out) else None


def _latex2mathml(latex: str, display: bool) -> str:
    from latex2mathml.converter import convert  # imported on first use: the CLI never needs it

    return convert(latex, display="block" if display else "inline")


def _write(element: ElementTree.Element, out: list[str]) -> bool:
    tag = element.tag.removeprefix(_NS)
    if tag not in _ELEMENTS or (tag == "math") != (not out):  # <math> once, outside
        return False
    attributes = "".join(
        f' {name}="{value}"'
        for name, value in sorted(element.attrib.items())
        if name in _ATTRIBUTES and _ATTRIBUTES[name].fullmatch(value)
    )
    if (
        tag == "mi"
        and not attributes
        and len(element) == 0
        and _FUNCTION.fullmatch(element.text or "")
    ):
        # \log, \sin, \exp come as <mi>log</mi>, which MathML Core sets with no space around
        # ("nlogn"); as an operator with TeX's thin spaces it reads "n log n" (\max and \lim already
        # come as <mo>).
        tag, attributes = "mo", ' lspace="0.167em" rspace="0.167em"'
    out.append(f"<{tag}{attributes}>")
    if not _chars(element.text, out):
        return False
    for child in element:
        if not _write(child, out) or not _chars(child.tail, out):
            return False
    out.append(f"</{tag}>")
    return True


def _chars(text: str | None, out: list[str]) -> bool:
    """Text as character references (nothing a markdown or HTML parser reads as syntax)."""
    if not text:
        return True
    if "\\" in text:  # a command latex2mathml does not know (`\url`), shown as its name
        return False
    out.append("".join(ch if _SAFE_CHAR.match(ch) else f"&#x{ord(ch):X};" for ch in text))
    return True


_WIDE_ACCENT = re.compile(r"\\wide(tilde|hat)\b")
# Symbols pylatexenc does not know, which would read as their name (`$\colon$` in a title: "colon").
_SYMBOLS = {"colon": ":", "coloneqq": "≔", "eqqcolon": "≕"}


@lru_cache(maxsize=4096)
def math_text(latex: str) -> str:
    """One math span as readable Unicode text: `\\mathcal{O}(n \\log n)` -> "𝒪(n log n)", `R^2` ->
    "R²"."""
    from pylatexenc.latex2text import LatexNodes2Text, get_default_latex_context_db

    def script(m: re.Match[str]) -> str:
        body, table = m.group(2) or m.group(3), _SUP if m.group(1) == "^" else _SUB
        if all(ch in table for ch in body):
            return "".join(table[ch] for ch in body)
        return m.group(0) if m.group(3) else f"{m.group(1)}({m.group(2)})"

    known = get_default_latex_context_db()

    # a macro pylatexenc does not know would vanish: keep its name
    def macro(m: re.Match[str]) -> str:
        if m.group(1) in _SYMBOLS:
            return _SYMBOLS[m.group(1)]
        return m.group(0) if known.get_macro_spec(m.group(1)) is not None else m.group(1)

    # pylatexenc drops the wide accents with their mark (`\widetilde{d}` -> "d", which reads as
    # another symbol): their narrow forms keep it ("d̃").
    latex = _WIDE_ACCENT.sub(lambda m: "\\" + m.group(1), latex)
    source = _STYLE.sub("", _NOT_CONTENT.sub("", _unwrap_text(latex)))
    source = _SCRIPT.sub(script, _MACRO.sub(macro, source))
    source = re.sub(r"(?<!\\)%", r"\\%", source)  # % is a comment in LaTeX
    try:
        text = LatexNodes2Text(
            math_mode="text", strict_latex_spaces="based-on-source"
        ).latex_to_text(source)
    except Exception:  # pylatexenc fails on some input (`\href` in math): show it as written
        text = latex
    return " ".join(text.split()) or " ".join(latex.split())


def _unwrap_text(latex: str) -> str:
    """The LaTeX with its text commands replaced by their arguments, innermost first."""
    while True:
        unwrapped = _TEXT_ARGUMENT.sub(lambda m: m.group(1), latex)
        if unwrapped == latex:
            return latex
        latex = unwrapped


def _text_only(latex: str) -> bool:
    """Math that is only text commands (`$\\texttt{\\textbf{Name}}$`): shown as text with its
    markup."""
    return not re.search(r"[\\^_{}$]", _ESCAPED.sub("", _unwrap_text(latex)))


# ---------------------------------------------------------------- rendering


def to_html(
    text: str,
    plain: Callable[[str], str] = html.escape,
    marks: Sequence[tuple[int, int]] = (),
    mark: tuple[str, str] = ("<mark>", "</mark>"),
) -> str:
    """The text with its math as MathML and its text commands as markup; all else through `plain`.

    `plain` escapes text for the place it goes (HTML by default; the chat passes its markdown
    escaper). `marks` are (start, end) ranges of `text` to wrap in `mark`; one that begins or ends
    inside a math span or command grows to hold all of it."""
    pieces = parse(text)
    spans = _grow(marks, pieces)
    cuts = sorted({b for span in spans for b in span})
    frags: list[tuple[int, int, str]] = []
    for p in pieces:
        if p.kind == TEXT:
            edges = [p.start, *(c for c in cuts if p.start < c < p.end), p.end]
            frags += [(a, b, plain(typeset(text[a:b]))) for a, b in zip(edges, edges[1:])]
        else:
            frags.append((p.start, p.end, _html(p, text, plain)))
    starts, ends = {s for s, _ in spans}, {e for _, e in spans}
    out = []
    for a, b, fragment in frags:
        out += [mark[0]] * (a in starts) + [fragment] + [mark[1]] * (b in ends)
    return "".join(out)


def _grow(marks: Sequence[tuple[int, int]], pieces: list[Piece]) -> list[tuple[int, int]]:
    atoms = [(p.start, p.end) for p in pieces if p.kind != TEXT]
    grown: list[list[int]] = []
    for start, end in sorted(marks):
        if start >= end:
            continue
        for a, b in atoms:
            if a < start < b:
                start = a
            if a < end < b:
                end = b
        if grown and start <= grown[-1][1]:
            grown[-1][1] = max(grown[-1][1], end)
        else:
            grown.append([start, end])
    return [(s, e) for s, e in grown]


def _html(p: Piece, text: str, plain: Callable[[str], str]) -> str:
    if p.kind == CHAR:
        return plain(p.value)
    if p.kind == MATH:
        mathml = math_html(p.value, p.display)
        if mathml is not None:
            return mathml
        return to_html(p.value, plain) if _text_only(p.value) else plain(math_text(p.value))
    if p.value == "url":
        return plain(p.literal)
    inner = "".join(
        plain(text[q.start : q.end]) if q.kind == TEXT else _html(q, text, plain) for q in p.inner
    )
    tag = _WRAP.get(p.value)
    return f"<{tag}>{inner}</{tag}>" if tag and inner.strip() else inner


# Text-mode LaTeX a reader should not see: ``quotes'', dashes (-- and ---) and accents (\'e, \"{o},
# \v{s}; "{\'e}" too, whose braces only group), written as the characters they stand for.
_ACCENTS = {
    "'": "\u0301",
    "`": "\u0300",
    "^": "\u0302",
    '"': "\u0308",
    "~": "\u0303",
    "=": "\u0304",
    ".": "\u0307",
    "u": "\u0306",
    "v": "\u030c",
    "H": "\u030b",
    "c": "\u0327",
    "k": "\u0328",
}
_ACCENT = re.compile(
    r"(\{)?\\(?:([\"'`^~=.])\s{0,3}(?:\{([A-Za-z])\}|([A-Za-z]))|([uvHck])\s{0,3}\{([A-Za-z])\})"
    r"(?(1)\})"
)
_TYPOGRAPHY = [
    (re.compile(r"``"), "\u201c"),
    (re.compile(r"''"), "\u201d"),
    (re.compile(r"(?<![\w`])`(?=\w)([^`'\n]{1,200})'(?!\w)"), "\u2018\\1\u2019"),
    (re.compile(r"(?<!-)---(?!-)"), "\u2014"),
    (re.compile(r"(?<![-!<])--(?![->])"), "\u2013"),
]


def typeset(text: str) -> str:
    """Text-mode LaTeX as the characters it stands for: ``x'' as \u201cx\u201d, -- and --- as
    dashes, \\'e as \u00e9."""
    if "\\" in text:
        text = _ACCENT.sub(_accented, text)
    for pattern, replacement in _TYPOGRAPHY:
        text = pattern.sub(replacement, text)
    return text


def _accented(m: re.Match) -> str:
    letter = m.group(3) or m.group(4) or m.group(6)
    return unicodedata.normalize("NFC", letter + _ACCENTS[m.group(2) or m.group(5)])


def to_text(text: str) -> str:
    """The text as a reader would say it: math in Unicode, text commands as their text, no
    markup."""
    return "".join(_text(p, text) for p in parse(text))


def _text(p: Piece, text: str) -> str:
    if p.kind == TEXT:
        return typeset(text[p.start : p.end])
    if p.kind == CHAR:
        return p.value
    if p.kind == MATH:
        return math_text(p.value)
    if p.value == "url":
        return p.literal
    return "".join(_text(q, text) for q in p.inner)


def shorten(text: str, limit: int) -> str:
    """Whitespace collapsed, cut to `limit` characters with an ellipsis, never inside math or a
    command."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = limit - 1
    for p in parse(text):
        if p.kind != TEXT and p.start < cut < p.end:
            cut = p.start
            break
    return text[:cut].rstrip() + "…"


_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")


def plain_prose(text: str) -> str:
    """Text as a reader says it: LaTeX as Unicode text ("R²", "95%", no \\textbf) and no markdown
    emphasis (abstracts carry `**F**unction`). What the local model reads and what its answer
    quotes, and titles on the plain-text surfaces (the CLI, a text-only client's references)."""
    text = to_text(text)
    text = _BOLD.sub(lambda m: m.group(1) or m.group(2), text)
    return _ITALIC.sub(r"\1", text)
