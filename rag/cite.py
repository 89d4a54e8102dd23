"""Citations of indexed papers for reference managers: BibTeX, RIS and a markdown list.

`format_citations(papers, fmt)` takes `rag.corpus.Paper`s (e.g. from `RAG.papers(ids)`) and returns the
entries as one text. Only what the index knows goes in: a paper without authors, year, venue or url
gets the fields that are known plus a note naming what is missing, never made-up values. The year
comes from the paper's year field, else from a year written in its venue ("ICML 2026").

BibTeX keys are first author's last name + year + first significant title word, lowercase ASCII
("jung2026segmentdriven"); keys that collide within one output get a, b, ... suffixes. Field values
escape LaTeX's special characters (non-ASCII text stays UTF-8), and title words with capitals inside
them ("NeRF", "GPT-4") are braced so that bibliography styles keep their case. Entries are
`@inproceedings` with a `booktitle` (a known conference's proceedings, else the venue as written), or
`@misc` for a paper whose venue is unknown.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from .corpus import Paper
from .errors import InputError

CITE_FORMATS = ("bibtex", "ris", "markdown")
# For files and HTTP responses holding `format_citations` output.
CITE_SUFFIXES = {"bibtex": ".bib", "ris": ".ris", "markdown": ".md"}
CITE_MEDIA_TYPES = {"bibtex": "application/x-bibtex", "ris": "application/x-research-info-systems",
                    "markdown": "text/markdown"}

# Venue acronyms -> the proceedings' name; the acronym as written in the booktitle.
_VENUES: dict[str, tuple[str, str]] = {
    "icml": ("ICML", "International Conference on Machine Learning"),
    "neurips": ("NeurIPS", "Advances in Neural Information Processing Systems"),
    "nips": ("NIPS", "Advances in Neural Information Processing Systems"),
    "iclr": ("ICLR", "International Conference on Learning Representations"),
    "aistats": ("AISTATS", "International Conference on Artificial Intelligence and Statistics"),
    "colt": ("COLT", "Conference on Learning Theory"),
    "uai": ("UAI", "Conference on Uncertainty in Artificial Intelligence"),
    "alt": ("ALT", "International Conference on Algorithmic Learning Theory"),
    "acml": ("ACML", "Asian Conference on Machine Learning"),
    "cvpr": ("CVPR", "IEEE/CVF Conference on Computer Vision and Pattern Recognition"),
    "iccv": ("ICCV", "IEEE/CVF International Conference on Computer Vision"),
    "eccv": ("ECCV", "European Conference on Computer Vision"),
    "wacv": ("WACV", "IEEE/CVF Winter Conference on Applications of Computer Vision"),
    "acl": ("ACL", "Annual Meeting of the Association for Computational Linguistics"),
    "emnlp": ("EMNLP", "Conference on Empirical Methods in Natural Language Processing"),
    "naacl": ("NAACL", "Conference of the North American Chapter of the Association for Computational "
                       "Linguistics"),
    "coling": ("COLING", "International Conference on Computational Linguistics"),
    "colm": ("COLM", "Conference on Language Modeling"),
    "aaai": ("AAAI", "AAAI Conference on Artificial Intelligence"),
    "ijcai": ("IJCAI", "International Joint Conference on Artificial Intelligence"),
    "corl": ("CoRL", "Conference on Robot Learning"),
    "icra": ("ICRA", "IEEE International Conference on Robotics and Automation"),
    "iros": ("IROS", "IEEE/RSJ International Conference on Intelligent Robots and Systems"),
    "rss": ("RSS", "Robotics: Science and Systems"),
}
_YEAR = re.compile(r"(?<!\d)(19[5-9]\d|20\d\d)(?!\d)")
# Words a title often starts with that say nothing about the paper (skipped for the key).
_STOPWORDS = frozenset("""a an the on of in for to and or with without via from by at as is are be can do does
how what when where which who why towards toward into""".split())
_NAME_SUFFIXES = frozenset({"jr", "sr", "ii", "iii", "iv"})
# One pass over the text: each LaTeX special character and its escaped form.
_LATEX = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
          "_": r"\_", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_SPECIAL = re.compile(r"[\\{}&%$#_~^]")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~$])")  # no emphasis, links, code, html, tables, math


@dataclass
class _Facts:
    """What is known of one paper, in the shapes every format uses."""

    paper: Paper
    title: str
    authors: list[str]
    year: str | None
    venue: str | None  # the venue as written
    booktitle: str | None  # the proceedings' name, e.g. "International Conference on Machine Learning (ICML 2026)"
    short_venue: str | None  # e.g. "ICML 2026"
    url: str | None

    @property
    def missing(self) -> list[str]:
        return [name for name, value in (("title", self.title), ("authors", self.authors), ("year", self.year),
                                         ("venue", self.venue), ("url", self.url)) if not value]

    @property
    def note(self) -> str | None:
        missing = self.missing
        return f"Metadata incomplete: {', '.join(missing)} unknown" if missing else None


def format_citations(papers: Iterable[Paper], fmt: str = "bibtex") -> str:
    """The papers as BibTeX entries, RIS records or a numbered markdown list (`fmt` in `CITE_FORMATS`).

    Papers are listed in the order given, each id once; the text ends with a newline ("" for no papers)."""
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
    """`fmt` as one of `CITE_FORMATS` (case and surrounding spaces ignored); InputError otherwise."""
    name = str(fmt).strip().lower()
    if name not in CITE_FORMATS:
        raise InputError(f"unknown citation format {fmt!r}; use one of {', '.join(CITE_FORMATS)}")
    return name


def cited_paper_ids(answer) -> list[str]:
    """The ids of the papers an `Answer` cites, in the order of their [n] markers."""
    return list(dict.fromkeys(s.paper_id for s in sorted(answer.sources, key=lambda s: s.n) if s.cited))


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
    venue = _clean(paper.venue) or None
    year_match = _YEAR.search(_clean(paper.year)) or _YEAR.search(venue or "")
    year = year_match.group(1) if year_match else None
    booktitle = short_venue = venue
    known = _known_venue(venue)
    if known:
        acronym, name = known
        short_venue = f"{acronym} {year}" if year else acronym
        booktitle = f"{name} ({short_venue})"
    return _Facts(paper=paper, title=_clean(paper.title), authors=[_clean(a) for a in paper.authors if _clean(a)],
                  year=year, venue=venue, booktitle=booktitle, short_venue=short_venue, url=_clean(paper.url) or None)


def _known_venue(venue: str | None) -> tuple[str, str] | None:
    """A conference's proceedings when the venue names one (not one of its workshops)."""
    words = re.findall(r"[a-z]+", (venue or "").lower())
    if "workshop" in words or "workshops" in words:
        return None
    for word in words:
        if word in _VENUES:
            return _VENUES[word]
    return None


# ---------------------------------------------------------------- keys

def _ascii(text: str) -> str:
    """Lowercase ASCII letters and digits only ("Müller-Lüdenscheidt" -> "mullerludenscheidt")."""
    folded = unicodedata.normalize("NFKD", text.replace("ß", "ss").replace("ø", "o").replace("Ø", "O")
                                   .replace("ł", "l").replace("Ł", "L").replace("æ", "ae").replace("Æ", "AE"))
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
    for w in words:
        if w not in _STOPWORDS and not w.isdigit() and len(w) > 1:
            return w
    return words[0] if words else ""


def _base_key(paper: Paper) -> str:
    facts = _facts(paper)
    name = next((n for n in (_last_name(a) for a in facts.authors) if n), "")
    key = name + (facts.year or "") + _title_word(facts.title)
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


def _protect(word: str) -> str:
    """A title word, escaped; braced when a capital letter follows its first character (acronyms,
    CamelCase names), which bibliography styles would otherwise lowercase."""
    if not any(c.isupper() and word[i - 1].isalnum() for i, c in enumerate(word) if i):
        return latex_escape(word)
    lead, core, tail = re.fullmatch(r"(\W*)(.*?)(\W*)", word, re.S).groups()  # type: ignore[union-attr]
    escaped = latex_escape(core)
    # {\...} is a "special character" to BibTeX, whose letters it may still change: brace twice.
    braced = "{{" + escaped + "}}" if escaped.startswith("\\") else "{" + escaped + "}"
    return latex_escape(lead) + braced + latex_escape(tail)


def _author(name: str) -> str:
    escaped = latex_escape(name)
    return "{" + escaped + "}" if re.search(r"\sand\s", name, re.I) else escaped  # one name, not two


def _bibtex(f: _Facts, key: str) -> str:
    fields: list[tuple[str, str]] = []
    if f.title:
        fields.append(("title", " ".join(_protect(w) for w in f.title.split(" "))))
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
    # The url field is read verbatim by the url package; only braces and a backslash can break the entry.
    return url.replace("\\", "%5C").replace("{", "%7B").replace("}", "%7D")


# ---------------------------------------------------------------- RIS and markdown

def _ris(f: _Facts) -> str:
    lines = [("TY", "CONF" if f.booktitle else "GEN")]
    lines += [("AU", a) for a in f.authors]
    if f.title:
        lines.append(("TI", f.title))
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
    title = f.title or f"Untitled ({f.paper.paper_id})"
    parts.append(markdown_escape(title) + ("" if title[-1] in ".?!" else "."))
    if f.short_venue:
        parts.append(markdown_escape(f.short_venue) + ".")
    if f.url:
        parts.append(f"<{f.url}>" if re.match(r"https?://\S+$", f.url) else markdown_escape(f.url))
    if f.note:
        parts.append(f"({markdown_escape(f.note)})")
    return " ".join(parts)
