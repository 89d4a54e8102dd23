r"""Citations of indexed papers for reference managers: BibTeX, RIS and a markdown list.

`format_citations(papers, fmt)` takes `rag.index.corpus.Paper`s (e.g. from `RAG.papers(ids)`) and
returns the entries as one text. Only what the index knows goes in: missing fields are named in a
note, never made up. BibTeX keeps a title's math and text commands as LaTeX (braced so that styles
keep their case) and writes as text whatever could break the entry; RIS and markdown get the
title's Unicode reading (`rag.latex.to_text`). Keys, venues and examples: docs/cli.md#citations.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from rag.errors import InputError
from rag.index.corpus import Paper
from rag.latex import CHAR, MATH, TEXT, Piece, math_html, math_text, parse, to_text
from rag.metadata import paper_metadata

CITE_FORMATS = ("bibtex", "ris", "markdown")
# For files and HTTP responses holding `format_citations` output.
CITE_SUFFIXES = {"bibtex": ".bib", "ris": ".ris", "markdown": ".md"}
CITE_MEDIA_TYPES = {
    "bibtex": "application/x-bibtex",
    "ris": "application/x-research-info-systems",
    "markdown": "text/markdown",
}

# Words a title often starts with that say nothing about the paper (skipped for the key).
_STOPWORDS = frozenset(
    """a an the on of in for to and or with without via from by at as is are be can do does
how what when where which who why towards toward into""".split()
)
_NAME_SUFFIXES = frozenset({"jr", "sr", "ii", "iii", "iv"})
# One pass over the text: each LaTeX special character and its escaped form. Braces are not `\{`:
# BibTeX counts those as braces too, so one that pairs with nothing would break the entry.
_LATEX = {
    "\\": r"\textbackslash{}",
    "{": r"\textbraceleft{}",
    "}": r"\textbraceright{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_LATEX_SPECIAL = re.compile(r"[\\{}&%$#_~^]")
# Text commands a BibTeX title keeps as commands: all in LaTeX's kernel, so every document typesets
# them. The others `rag.latex` knows (`\text`, `\url`, `\href`) give their text.
_KEPT_COMMANDS = frozenset(
    {
        "emph",
        "textit",
        "textsl",
        "textbf",
        "underline",
        "texttt",
        "textrm",
        "textsf",
        "textsc",
        "textup",
        "textmd",
        "textnormal",
        "mbox",
    }
)
# Math's tokens for `_safe_math`: commands and escaped characters whole, a trailing backslash, a
# character.
_MATH_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\\$|\S", re.S)
# Commands latex2mathml reads (MathJax's) that LaTeX does not know without a package.
_NOT_LATEX = re.compile(
    r"\\(?:href|url|style|class|color|textcolor|colorbox|fcolorbox|htmlClass|htmlId|htmlStyle|"
    r"htmlData|cssId)(?![A-Za-z])"
)
# A text command's argument, inside math, holding a script character (`$\text{a_b}$`: an error in
# text mode).
_SCRIPT_IN_TEXT = re.compile(r"\\(?:text[a-z]*|mbox|emph)\s*\{[^{}]*[\^_]")
# Leading and trailing punctuation of a word, left outside its protecting braces ("({NeRF})",
# "{$V_0$}:").
_LEAD, _TAIL = re.compile(r"\W*"), re.compile(r"\W*$")
_OPENERS = {")": "(", "]": "["}
# A line break (`\\`) is no title's math, and before a brace it makes readers count braces
# differently.
_UNSAFE_IN_MATH = frozenset({"%", "#", "&", "$", "\\", "\\\\", "\\(", "\\)", "\\[", "\\]"})
# no emphasis, links, code, html, tables, math
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~$])")


@dataclass
class _Facts:
    """What is known of one paper, in the shapes every format uses."""

    paper: Paper
    title: str  # as written, LaTeX and all
    text_title: str  # as read: math in Unicode, no markup (for RIS, markdown and keys)
    authors: list[str]
    year: str | None
    venue: str | None  # the venue as written
    # the proceedings' name, e.g. "International Conference on Machine Learning (ICML 2026)"
    booktitle: str | None
    short_venue: str | None  # e.g. "ICML 2026"
    url: str | None

    @property
    def missing(self) -> list[str]:
        return [
            name
            for name, value in (
                ("title", self.title),
                ("authors", self.authors),
                ("year", self.year),
                ("venue", self.venue),
                ("url", self.url),
            )
            if not value
        ]

    @property
    def note(self) -> str | None:
        missing = self.missing
        return f"Metadata incomplete: {', '.join(missing)} unknown" if missing else None


def format_citations(papers: Iterable[Paper], fmt: str = "bibtex") -> str:
    """The papers as BibTeX entries, RIS records or a numbered markdown list (`fmt` in
    `CITE_FORMATS`).

    Papers are listed in the order given, each id once; the text ends with a newline ("" for no
    papers)."""
    fmt = check_format(fmt)
    facts = [_facts(p) for p in _unique(papers)]
    if not facts:
        return ""
    if fmt == "bibtex":
        keys = citation_keys([f.paper for f in facts])
        return "\n".join(_bibtex(f, key) for f, key in zip(facts, keys))
    if fmt == "ris":
        return "\n".join(_ris(f) for f in facts)
    return "".join(f"{i}. {_markdown(f)}\n" for i, f in enumerate(facts, 1))


def check_format(fmt: str) -> str:
    """`fmt` as one of `CITE_FORMATS` (case and surrounding spaces ignored); InputError
    otherwise."""
    name = str(fmt).strip().lower()
    if name not in CITE_FORMATS:
        raise InputError(f"unknown citation format {fmt!r}; use one of {', '.join(CITE_FORMATS)}")
    return name


def cited_paper_ids(answer) -> list[str]:
    """The ids of the papers an `Answer` cites, in the order of their [n] markers."""
    return list(
        dict.fromkeys(s.paper_id for s in sorted(answer.sources, key=lambda s: s.n) if s.cited)
    )


def citation_keys(papers: Iterable[Paper]) -> list[str]:
    """BibTeX keys for the papers, unique within the list: colliding keys get a, b, ... suffixes."""
    papers = list(papers)
    base = [_base_key(p) for p in papers]
    counts: dict[str, int] = {}
    for key in base:
        counts[key] = counts.get(key, 0) + 1
    used = {key for key in base if counts[key] == 1}
    out = []
    for key in base:
        if counts[key] == 1:
            out.append(key)
            continue
        n = 0
        while (candidate := key + _letters(n)) in used:
            n += 1
        used.add(candidate)
        out.append(candidate)
    return out


# ---------------------------------------------------------------- facts


def _unique(papers: Iterable[Paper]) -> list[Paper]:
    seen: dict[str, Paper] = {}
    for p in papers:
        seen.setdefault(p.paper_id, p)
    return list(seen.values())


def _clean(text: str | None) -> str:
    return " ".join(str(text or "").split())


def _facts(paper: Paper) -> _Facts:
    meta = paper_metadata(paper)  # year and venue as every surface shows them (rag/metadata.py)
    year, venue, booktitle, short_venue = (
        meta.year,
        meta.venue_as_written,
        meta.booktitle,
        meta.venue,
    )
    title = _clean(paper.title)
    return _Facts(
        paper=paper,
        title=title,
        text_title=_clean(to_text(title)),
        authors=[_clean(a) for a in paper.authors if _clean(a)],
        year=year,
        venue=venue,
        booktitle=booktitle,
        short_venue=short_venue,
        url=_clean(paper.url) or None,
    )


# ---------------------------------------------------------------- keys


def _ascii(text: str) -> str:
    """Lowercase ASCII letters and digits only ("Müller-Lüdenscheidt" -> "mullerludenscheidt")."""
    folded = unicodedata.normalize(
        "NFKD",
        text.replace("ß", "ss")
        .replace("ø", "o")
        .replace("Ø", "O")
        .replace("ł", "l")
        .replace("Ł", "L")
        .replace("æ", "ae")
        .replace("Æ", "AE"),
    )
    return re.sub(r"[^a-z0-9]", "", folded.encode("ascii", "ignore").decode().lower())


def _last_name(name: str) -> str:
    if "," in name:  # "Last, First"
        return _ascii(name.split(",")[0])
    parts = [w for w in name.split() if _ascii(w)]
    while len(parts) > 1 and _ascii(parts[-1]) in _NAME_SUFFIXES:
        parts.pop()
    return _ascii(parts[-1]) if parts else ""


def _title_word(title: str) -> str:
    words = [_ascii(w) for w in re.split(r"[\W_]+", title)]
    words = [w for w in words if w]
    for w in words:  # a word led by a digit would run into the year ("wang20262k")
        if w not in _STOPWORDS and not w[0].isdigit() and len(w) > 1:
            return w
    return words[0] if words else ""


def _base_key(paper: Paper) -> str:
    facts = _facts(paper)
    name = next((n for n in (_last_name(a) for a in facts.authors) if n), "")
    key = name + (facts.year or "") + _title_word(facts.text_title)
    if not key or not name:  # no author: say so rather than start a key with a year or a title word
        key = "anon" + key if key else "paper" + _ascii(paper.paper_id)
    return key or "paper"


def _letters(n: int) -> str:
    """0 -> a, 25 -> z, 26 -> aa, ..."""
    out = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        out = chr(97 + r) + out
    return out


# ---------------------------------------------------------------- BibTeX


def latex_escape(text: str) -> str:
    """Text with LaTeX's special characters escaped, so that it typesets as written."""
    return _LATEX_SPECIAL.sub(lambda m: _LATEX[m.group()], text)


def bibtex_title(title: str) -> str:
    """The title as a BibTeX field value: its math and text commands as LaTeX, its text escaped, and
    its words braced where a bibliography style's case change would alter them."""
    return " ".join(_bibtex_word(word) for word in _words(_title_parts(title, parse(title))))


# A title as parts: (True, LaTeX kept as written) or (False, text still to escape).
_Part = tuple[bool, str]


def _title_parts(text: str, pieces: list[Piece]) -> list[_Part]:
    """The pieces of `text` as parts: math as `_math_part` says, kept commands as themselves with
    their argument's LaTeX, the rest text."""
    parts: list[_Part] = []
    for p in pieces:
        if p.kind == TEXT:
            parts.append((False, text[p.start : p.end]))
        elif p.kind == CHAR:
            parts.append((False, p.value))
        elif p.kind == MATH:
            parts.append(_math_part(p.value.strip(), text[p.start : p.end]))
        elif p.value in _KEPT_COMMANDS:
            inner = "".join(
                s if kept else latex_escape(s) for kept, s in _title_parts(text, p.inner)
            )
            parts.append((True, f"\\{p.value}{{{inner}}}"))
        elif p.value == "url":
            parts.append((False, p.literal))
        else:
            parts += _title_parts(text, p.inner)
    return parts


def _math_part(latex: str, written: str) -> _Part:
    """Math as `$...$` when it is whole and known: safe in a field (`_safe_math`), ASCII (pdfLaTeX
    takes no `$x^é$`), free of the web's commands (`\\href`) and read by latex2mathml, so the chat
    shows it as math too. Math that is whole but unknown (`$\\mymethod$`, `$x^2^3$`, `$\\left( x$`)
    is text, its Unicode reading; math that is not whole is text as written (its reading would be
    noise)."""
    if not _safe_math(latex):
        return False, written
    if latex.isascii() and not _NOT_LATEX.search(latex) and math_html(latex) is not None:
        return True, f"${latex}$"
    return False, math_text(latex)


def _safe_math(latex: str) -> bool:
    r"""Whether the math, between `$`s, can go into a BibTeX field and a LaTeX document as written:
    its braces balanced both as LaTeX reads them and as BibTeX does (which counts `\{` too), no bare
    `%` (a comment), `#` or `&`, no math delimiters or line breaks, no trailing backslash, no script
    without an operand, no script character in a text command's argument."""
    tokens = [m.group() for m in _MATH_TOKEN.finditer(latex)]
    return (
        bool(tokens)
        and not _UNSAFE_IN_MATH.intersection(tokens)
        and _balanced(t for t in tokens if t in "{}")
        and _balanced(c for c in latex if c in "{}")
        and _scripts_have_operands(tokens)
        and not _SCRIPT_IN_TEXT.search(latex)
    )


def _scripts_have_operands(tokens: list[str]) -> bool:
    """Whether each `^` and `_` has something to raise or lower (`$x^$`, `$^_$` do not compile)."""
    scripts = [i for i, token in enumerate(tokens) if token in ("^", "_")]
    return all(i + 1 < len(tokens) and tokens[i + 1] not in ("^", "_", "}", "~") for i in scripts)


def _balanced(braces: Iterable[str]) -> bool:
    depth = 0
    for brace in braces:
        depth += 1 if brace == "{" else -1
        if depth < 0:
            return False
    return depth == 0


def _words(parts: list[_Part]) -> list[list[_Part]]:
    """The parts grouped into the title's words: split at spaces of the text, never inside kept
    LaTeX (`$(\\varepsilon, \\delta)$` is one word with what touches it); text next to text is one
    part."""
    words: list[list[_Part]] = [[]]
    for kept, s in parts:
        for i, chunk in enumerate([s] if kept else s.split(" ")):
            if i:
                words.append([])
            if kept or not words[-1] or words[-1][-1][0]:
                words[-1].append((kept, chunk))
            else:
                words[-1][-1] = (False, words[-1][-1][1] + chunk)
    return [w for w in words if any(s for _, s in w)]


def _bibtex_word(word: list[_Part]) -> str:
    """One word of the title, escaped; braced (punctuation around it left out) when it holds LaTeX,
    which must keep its case (`$V_0$` lowercased is another symbol), or when a capital letter
    follows its first character (acronyms, CamelCase names), which bibliography styles would
    otherwise lowercase."""
    latex = "".join(s if kept else latex_escape(s) for kept, s in word)
    if not any(kept for kept, _ in word) and not _inner_capital(word[0][1]):
        return latex
    lead = "" if word[0][0] else latex_escape(_LEAD.match(word[0][1]).group())  # type: ignore[union-attr]
    tail = "" if word[-1][0] else latex_escape(_TAIL.search(word[-1][1]).group())  # type: ignore[union-attr]
    core, tail = _closed(latex[len(lead) : len(latex) - len(tail)], tail)
    return lead + _brace(core) + tail


def _closed(core: str, tail: str) -> tuple[str, str]:
    """The core with the tail's closing brackets it opened (`{Suite($S^3$)}:`, not
    `{Suite($S^3$}):`)."""
    while tail and tail[0] in _OPENERS and core.count(_OPENERS[tail[0]]) > core.count(tail[0]):
        core, tail = core + tail[0], tail[1:]
    return core, tail


def _inner_capital(word: str) -> bool:
    return any(c.isupper() and word[i - 1].isalnum() for i, c in enumerate(word) if i)


def _brace(latex: str) -> str:
    """LaTeX braced against case changes. `{\\...}` is a "special character" to BibTeX, whose
    letters it may still change: that is braced twice."""
    return "{{" + latex + "}}" if latex.startswith("\\") else "{" + latex + "}"


def _author(name: str) -> str:
    escaped = latex_escape(name)
    # one name, not two
    return "{" + escaped + "}" if re.search(r"\sand\s", name, re.I) else escaped


def _bibtex(f: _Facts, key: str) -> str:
    fields: list[tuple[str, str]] = []
    if title := bibtex_title(f.title):
        fields.append(("title", title))
    if f.authors:
        fields.append(("author", " and ".join(_author(a) for a in f.authors)))
    if f.booktitle:
        fields.append(("booktitle", latex_escape(f.booktitle)))
    if f.year:
        fields.append(("year", f.year))
    if f.url:
        fields.append(("url", _url(f.url)))
    if f.note:
        fields.append(("note", latex_escape(f.note)))
    kind = "inproceedings" if f.booktitle else "misc"
    body = ",\n".join(f"  {name} = {{{value}}}" for name, value in fields)
    return f"@{kind}{{{key},\n{body}\n}}\n"


def _url(url: str) -> str:
    # The url field is read verbatim by the url package; only braces and a backslash can break the
    # entry.
    return url.replace("\\", "%5C").replace("{", "%7B").replace("}", "%7D")


# ---------------------------------------------------------------- RIS and markdown


def _ris(f: _Facts) -> str:
    lines = [("TY", "CONF" if f.booktitle else "GEN")]
    lines += [("AU", a) for a in f.authors]
    if f.text_title:
        lines.append(("TI", f.text_title))
    if f.booktitle:
        lines.append(("T2", f.booktitle))
    if f.year:
        lines.append(("PY", f.year))
    if f.url:
        lines.append(("UR", f.url))
    if f.note:
        lines.append(("N1", f.note))
    lines.append(("ER", ""))
    return "".join(f"{tag}  - {value}\n" for tag, value in lines)


def markdown_escape(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def _markdown(f: _Facts) -> str:
    parts = []
    if f.authors:
        parts.append(markdown_escape(", ".join(f.authors)) + (f" ({f.year})." if f.year else "."))
    elif f.year:
        parts.append(f"({f.year}).")
    title = f.text_title or f"Untitled ({f.paper.paper_id})"
    parts.append(markdown_escape(title) + ("" if title[-1] in ".?!" else "."))
    if f.short_venue:
        parts.append(markdown_escape(f.short_venue) + ".")
    if f.url:
        parts.append(
            f"<{_autolink_url(f.url)}>"
            if re.match(r"https?://[^\s/]", f.url)
            else markdown_escape(f.url)
        )
    if f.note:
        parts.append(f"({markdown_escape(f.note)})")
    return " ".join(parts)


# What could end an autolink or start markup around it ("<", ">", quotes, brackets, parentheses,
# backslash, backtick...), whitespace and control characters: percent-encoded, so a url from a data
# file stays one link (browsers decode them) and cannot break out into an image or raw HTML.
_URL_UNSAFE = re.compile(r"""[\x00-\x20\x7f<>"'`()\[\]{}\\|^]""")


def _autolink_url(url: str) -> str:
    return _URL_UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", url)
