"""Citations for reference managers: BibTeX read back by a real parser (bibtexparser 2), RIS,
markdown, `RAG.papers`, `rag cite`, `rag ask --bibtex`, and the UI's "Export citations (BibTeX)"
download in Chromium.

Real data: the 76 seed papers and 200 records of the ICML 2026 main track (LaTeX in titles,
non-ASCII names, records without an id or url), each indexed by the real ingest (the 200 with the
hashing embedder: their metadata is what is checked); and the 678 titles of the shipped ICML 2026
sample (every one of the 5,862 with LaTeX in it), compiled by a real BibTeX (Debian's texlive-base,
scripts/install_test_deps.sh).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import bibtexparser
import pytest
from bibtexparser import middlewares

from rag.cite import CITE_FORMATS, bibtex_title, citation_keys, cited_paper_ids, format_citations
from rag.errors import InputError
from rag.index.corpus import Paper, parse_file
from rag.latex import to_text
from tests.conftest import REPO, icml_rows, run_cli, write_jsonl

QUESTION = "How does Palimpsa relate to Mamba2?"
ICML_BOOKTITLE = "International Conference on Machine Learning (ICML 2026)"
_UNESCAPE = {
    r"\textbackslash{}": "\\",
    r"\textasciitilde{}": "~",
    r"\textasciicircum{}": "^",
    r"\textbraceleft{}": "{",
    r"\textbraceright{}": "}",
}
# Math (kept whole), an escaped character, a command with its argument's brace, or a brace.
_FIELD_TOKEN = re.compile(
    r"\$(?:\\.|[^$\\])*\$|\\text(?:backslash|asciitilde|asciicircum|braceleft|braceright)\{\}|\\[&%$#_{}]|"
    r"\\[A-Za-z]+\{|[{}]"
)


def unlatex(value: str) -> str:
    """A field value as the text it encodes: math and commands as written, escapes undone,
    protecting braces dropped (`{$V_0$}: A \\& {{\\emph{B}}}` -> `$V_0$: A & \\emph{B}`)."""
    # per open brace: a command's argument (kept) or a case protection (dropped)
    kept: list[bool] = []

    def one(m: re.Match) -> str:
        token = m.group()
        if token.startswith("$"):
            return token
        if token in _UNESCAPE:
            return _UNESCAPE[token]
        if token.startswith("\\") and token.endswith("{") and len(token) > 2:
            kept.append(True)
            return token
        if token.startswith("\\"):
            return token[1]
        if token == "{":
            kept.append(False)
            return ""
        return "}" if kept.pop() else ""

    return _FIELD_TOKEN.sub(one, value)


def parse_bibtex(text: str) -> list:
    """The entries of a BibTeX text, with authors split; fails on any block the parser cannot
    read."""
    library = bibtexparser.parse_string(text, append_middleware=[middlewares.SeparateCoAuthors()])
    assert not library.failed_blocks, [b.raw[:200] for b in library.failed_blocks]
    assert not library.comments and not library.strings and not library.preambles
    keys = [e.key for e in library.entries]
    assert len(keys) == len(set(keys)), "duplicate keys"
    assert all(re.fullmatch(r"[a-z][a-z0-9]*", k) for k in keys), keys
    return library.entries


def field(entry, name: str):
    f = entry.fields_dict.get(name)
    return None if f is None else f.value


def plain(text: str) -> str:
    return " ".join(text.split())


def check_entry(
    entry,
    title: str,
    authors: list[str],
    url: str | None,
    year: str | None = "2026",
    booktitle: str | None = ICML_BOOKTITLE,
) -> None:
    assert unlatex(field(entry, "title")) == plain(title), entry.key
    assert [unlatex(a) for a in field(entry, "author")] == [plain(a) for a in authors], entry.key
    assert field(entry, "url") == (url or None) and field(entry, "year") == year
    assert (
        unlatex(field(entry, "booktitle")) if booktitle else field(entry, "booktitle")
    ) == booktitle
    assert entry.entry_type == ("inproceedings" if booktitle else "misc")


# ---------------------------------------------------------------- the formats, on made-up papers

HARD_TITLE = r"A & B: 100% of $\sqrt{T}$ #1 _x_ {braces} ~ ^ \ café NeRF (LLMs) GPT-4"


def test_special_characters_are_escaped_and_capitals_protected():
    paper = Paper(
        "x1",
        title=HARD_TITLE,
        authors=["José Müller-Lüdenscheidt", "Tom and Jerry Inc"],
        url="https://openreview.net/forum?id=x1",
        venue="ICML 2026",
    )
    text = format_citations([paper])
    title = re.search(r"title = \{(.*)\},\n", text).group(1)
    # Math stays math; braces in text are \textbraceleft{}: BibTeX counts `\{` as a brace, so a lone
    # one breaks the entry.
    assert (
        r"A \& B: 100\% of {$\sqrt{T}$} \#1 \_x\_ \textbraceleft{}braces\textbraceright{}"
        r" \textasciitilde{}" in title
    )
    assert r"\textasciicircum{} \textbackslash{} café {NeRF} ({LLMs}) {GPT-4}" in title
    (entry,) = parse_bibtex(text)
    # skipped: stopwords, single letters (√T), numbers
    assert entry.key == "mullerludenscheidt2026braces"
    check_entry(entry, HARD_TITLE, paper.authors, paper.url)
    # one name, not two
    assert field(entry, "author") == ["José Müller-Lüdenscheidt", "{Tom and Jerry Inc}"]
    # An independent decoder (pylatexenc, through bibtexparser) reads the same title, math as
    # written, but for ~ ^ \ which it turns into typographic symbols, and \textbraceleft{}, which it
    # does not know.
    decoded = bibtexparser.parse_string(
        text, append_middleware=[middlewares.LatexDecodingMiddleware()]
    )
    assert field(decoded.entries[0], "title").startswith(r"A & B: 100% of $\sqrt{T}$ #1 _x_ braces")
    assert field(decoded.entries[0], "title").endswith("café NeRF (LLMs) GPT-4")


# Titles with math (ICML 2026's, shortened): the key, the BibTeX title, and the title RIS and
# markdown give.
MATH_TITLES = [
    (
        r"$\textit{S}$-SPPO: Semantic-Calibrated Self-Play Preference Optimization",
        "chen2026sppo",
        r"{$\textit{S}$-SPPO}: Semantic-Calibrated Self-Play Preference Optimization",
        "S-SPPO: Semantic-Calibrated Self-Play Preference Optimization",
    ),
    (
        "A$^2$SG: Adaptive and Asymmetric Surrogate Gradients",
        "chen2026a2sg",
        "{A$^2$SG}: Adaptive and Asymmetric Surrogate Gradients",
        "A²SG: Adaptive and Asymmetric Surrogate Gradients",
    ),
    (
        "Clustering as Reasoning: A $k$-Means Interpretation of Chain-of-Thought Graph Learning",
        "chen2026clustering",
        "Clustering as Reasoning: A {$k$-Means} Interpretation of Chain-of-Thought Graph Learning",
        "Clustering as Reasoning: A k-Means Interpretation of Chain-of-Thought Graph Learning",
    ),
    (
        r"Discrete Diffusion with Physical Mass Constraints for \emph{De Novo} Peptide Sequencing",
        "chen2026discrete",
        (
            r"Discrete Diffusion with Physical Mass Constraints for {{\emph{De Novo}}} Peptide"
            r" Sequencing"
        ),
        "Discrete Diffusion with Physical Mass Constraints for De Novo Peptide Sequencing",
    ),
    (
        r"$\mathbb{R}^{2k}$ is Theoretically Large Enough",
        "chen2026theoretically",
        r"{$\mathbb{R}^{2k}$} is Theoretically Large Enough",
        "ℝ^(2k) is Theoretically Large Enough",
    ),
    (
        r"The impact of LoRA on Oversmoothing $\colon$ Understanding",
        "chen2026impact",
        r"The impact of {LoRA} on Oversmoothing {$\colon$} Understanding",
        "The impact of LoRA on Oversmoothing : Understanding",
    ),
    (
        r"Seizure-Semiology-Suite($S^3$): A Dataset",
        "chen2026seizure",
        r"{Seizure-Semiology-Suite($S^3$)}: A Dataset",
        "Seizure-Semiology-Suite(S³): A Dataset",
    ),
]


@pytest.mark.parametrize(("title", "key", "bibtex", "text"), MATH_TITLES)
def test_math_stays_math_in_bibtex_and_reads_as_unicode_elsewhere(title, key, bibtex, text):
    paper = Paper(
        "m1",
        title=title,
        authors=["Wei Chen"],
        url="https://openreview.net/forum?id=m1",
        venue="ICML 2026",
    )
    bib = format_citations([paper])
    assert f"  title = {{{bibtex}}},\n" in bib
    (entry,) = parse_bibtex(bib)
    assert entry.key == key and unlatex(field(entry, "title")) == title
    assert f"\nTI  - {text}\n" in format_citations([paper], "ris")
    assert format_citations([paper], "markdown").startswith(
        f"1. Wei Chen (2026). {text}. ICML 2026. <"
    )


# A title's LaTeX that is not whole gives text, escaped as written; math latex2mathml cannot read
# gives its Unicode reading; each in an entry BibTeX reads.
BROKEN_TITLES = [
    ("One $ stray dollar", r"One \$ stray dollar"),
    ("Costs $5 and $10 here", r"Costs \$5 and \$10 here"),
    (r"Bad $\frac{a$ braces", r"Bad \$\textbackslash{}frac\textbraceleft{}a\$ braces"),
    (r"Bad $a}{b$ order", r"Bad \$a\textbraceright{}\textbraceleft{}b\$ order"),
    (r"Escaped $\{x$ brace", r"Escaped \$\textbackslash{}\textbraceleft{}x\$ brace"),
    ("Lone { brace", r"Lone \textbraceleft{} brace"),
    ("A $50% cut$ here", r"A \$50\% cut\$ here"),
    ("A $x # y$ and $p & q$", r"A \$x \# y\$ and \$p \& q\$"),
    (
        r"Open \textit{group $x$ never closed",
        r"Open \textbackslash{}textit\textbraceleft{}group {$x$} never closed",
    ),
    (r"Trailing $x\\$ backslash", r"Trailing \$x\textbackslash{}\textbackslash{}\$ backslash"),
    (
        r"Our $\mymethod$ beats $x^$ and $\left( x$",
        r"Our mymethod beats \$x\textasciicircum{}\$ and ( x",
    ),
]


@pytest.mark.parametrize(("title", "bibtex"), BROKEN_TITLES)
def test_latex_that_is_not_whole_degrades_to_escaped_text(title, bibtex):
    assert bibtex_title(title) == bibtex
    (entry,) = parse_bibtex(
        format_citations([Paper("b1", title=title, authors=["Ann Lee"], venue="ICML 2026")])
    )
    assert field(entry, "title") == bibtex
    assert_typesets(bibtex)


def assert_typesets(value: str) -> None:
    """The field value as LaTeX that cannot break a document: balanced braces; outside math, every
    special character escaped; inside math, no comment, parameter or alignment character."""
    text, math = [], []
    for m in _LATEX_TOKEN.finditer(value):
        if m.group("math") is not None:
            math.append(m.group("math"))
        elif not m.group().startswith("\\"):
            text.append(m.group())
    assert not re.search(r"[%#&$^_~\\]", "".join(text)), value
    assert not any(re.search(r"[%#&]", re.sub(r"\\.", "", m)) for m in math), value
    depth = 0
    for brace in re.findall(r"[{}]", re.sub(r"\\.", "", value)):
        depth += 1 if brace == "{" else -1
        assert depth >= 0, value
    assert depth == 0, value


# Math, a command or escaped character, or one character.
_LATEX_TOKEN = re.compile(r"\$(?P<math>(?:\\.|[^$\\])*)\$|\\(?:[A-Za-z]+|.)|.", re.S)


def fuzz_titles(n: int = 400, seed: int = 30) -> list[str]:
    """Titles made of LaTeX's pieces at random: math, commands, escapes, stray braces and
    dollars."""
    tokens = [
        "$",
        "$",
        "{",
        "}",
        "\\",
        "\\\\",
        "\\$",
        "\\{",
        "%",
        "#",
        "&",
        "_",
        "^",
        "~",
        "\\textit{",
        "\\emph{",
        "\\url{",
        "\\href{",
        "\\text{",
        "\\(",
        "\\)",
        "$$",
        "\\frac{",
        "x",
        "Net",
        " ",
        " ",
        "NeRF",
        "é",
        "5",
        "\\alpha",
        "^{2}",
        "_0",
        "-",
        ":",
        "(",
        ")",
    ]
    rng = random.Random(seed)
    return [
        " ".join("".join(rng.choices(tokens, k=rng.randint(1, 25))).split()) or "x"
        for _ in range(n)
    ]


def test_any_latex_in_a_title_gives_an_entry_that_typesets():
    titles = fuzz_titles()
    papers = [
        Paper(f"f{i}", title=t, authors=["Ann Lee"], venue="ICML 2026")
        for i, t in enumerate(titles)
    ]
    entries = parse_bibtex(format_citations(papers))
    assert len(entries) == len(titles)
    for entry in entries:
        assert_typesets(field(entry, "title"))


def test_keys_are_author_year_word_and_collisions_get_letters():
    same = dict(title="The Cost of Information", authors=["Ann Lee", "Bo Li"], venue="ICML 2026")
    papers = [
        Paper("p1", **same),
        Paper("p2", **same),
        Paper("p3", title="On the Cost", authors=["Ann Lee"], year="2026"),
        Paper("p4", title="Ñandú: Über Models", authors=["Łukasz Øster Jr."], venue="NeurIPS 2024"),
        Paper("p1", title="a duplicate id is cited once"),
    ]
    assert citation_keys(papers[:4]) == [
        "lee2026costa",
        "lee2026costb",
        "lee2026costc",
        "oster2024nandu",
    ]
    entries = parse_bibtex(format_citations(papers))
    assert [e.key for e in entries] == [
        "lee2026costa",
        "lee2026costb",
        "lee2026costc",
        "oster2024nandu",
    ]
    assert (
        unlatex(field(entries[3], "booktitle"))
        == "Advances in Neural Information Processing Systems (NeurIPS 2024)"
    )
    assert citation_keys([papers[0]]) == ["lee2026cost"]  # alone: no suffix


def test_missing_metadata_is_noted_never_invented():
    papers = [
        Paper("abc123", label="We propose X, a thing"),
        Paper("def456", title="Only a Title"),
        Paper(
            "ghi789",
            title="Workshop Paper",
            authors=["Ann Lee"],
            venue="ICML 2026 Workshop on Stuff",
        ),
        Paper("jkl012", title="Old", authors=["Ann Lee"], venue="icml", year="2019"),
    ]
    entries = parse_bibtex(format_citations(papers))
    bare, titled, workshop, old = entries
    assert bare.entry_type == "misc" and set(bare.fields_dict) == {"note"}
    assert field(bare, "note") == "Metadata incomplete: title, authors, year, venue, url unknown"
    assert set(titled.fields_dict) == {"title", "note"} and "authors, year, venue, url" in field(
        titled, "note"
    )
    assert (
        field(workshop, "booktitle") == "ICML 2026 Workshop on Stuff"
        and field(workshop, "year") == "2026"
    )
    assert field(workshop, "note") == "Metadata incomplete: url unknown"
    assert field(old, "booktitle") == "International Conference on Machine Learning (ICML 2019)"
    ris = format_citations(papers, "ris")
    assert (
        "TY  - GEN\nN1  - Metadata incomplete: title, authors, year, venue, url unknown\nER  - \n"
        in ris
    )
    md = format_citations(papers, "markdown").splitlines()
    assert (
        md[0]
        == "1. Untitled (abc123). (Metadata incomplete: title, authors, year, venue, url unknown)"
    )
    assert md[3] == ("4. Ann Lee (2019). Old. ICML 2019. (Metadata incomplete: url unknown)")


def test_formats_and_their_errors():
    assert CITE_FORMATS == ("bibtex", "ris", "markdown")
    assert format_citations([], "ris") == "" and format_citations(
        [Paper("a")], " BibTeX "
    ).startswith("@misc{")
    with pytest.raises(
        InputError, match="unknown citation format 'bib'; use one of bibtex, ris, markdown"
    ):
        format_citations([Paper("a")], "bib")
    md = format_citations(
        [Paper("m", title="Fast *and* [robust] <b>x</b>", authors=["A_B"], year="2020")], "markdown"
    )
    assert (
        md
        == r"1. A\_B (2020). Fast \*and\* \[robust\] \<b\>x\</b\>. (Metadata incomplete: venue, url"
        r" unknown)" + "\n"
    )


# ---------------------------------------------------------------- the 76 seed papers


@pytest.fixture(scope="module")
def seed_meta() -> dict[str, dict]:
    rows = [
        json.loads(line) for line in (REPO / "corpus/seed_metadata.jsonl").read_text().splitlines()
    ]
    return {r["openreview_url"].split("id=")[1]: r for r in rows}


def test_every_seed_paper_is_valid_bibtex_with_its_fields_intact(seed_rag, seed_meta, seed_titles):
    ids = sorted(seed_titles)
    assert len(ids) == 76
    papers = seed_rag.papers(ids)
    assert [p.paper_id for p in papers] == ids
    entries = parse_bibtex(format_citations(papers))
    assert len(entries) == 76
    for paper_id, entry in zip(ids, entries):
        meta = seed_meta[paper_id]
        check_entry(entry, meta["title"], meta["authors"], meta["openreview_url"])
        assert "note" not in entry.fields_dict  # the seeds' metadata is complete
    ris = format_citations(papers, "ris")
    records = ris.split("\n\n")
    assert len(records) == 76
    for paper_id, record in zip(ids, records):
        lines = record.strip("\n").split("\n")
        assert all(re.fullmatch(r"[A-Z][A-Z0-9]  - .*", line) for line in lines), record
        assert lines[0] == "TY  - CONF" and lines[-1] == "ER  - "
        tags = [line[:2] for line in lines]
        assert tags.count("AU") == len(seed_meta[paper_id]["authors"]) and tags.count("TI") == 1
        assert (
            f"TI  - {to_text(seed_titles[paper_id])}" in lines
            and f"T2  - {ICML_BOOKTITLE}" in lines
        )
        assert "PY  - 2026" in lines and f"UR  - {seed_meta[paper_id]['openreview_url']}" in lines
    md = format_citations(papers, "markdown").splitlines()
    assert len(md) == 76 and all(line.startswith(f"{i}. ") for i, line in enumerate(md, 1))
    assert all(
        line.endswith(f"ICML 2026. <{seed_meta[i]['openreview_url']}>") for i, line in zip(ids, md)
    )
    assert all("(2026). " in line for line in md)


def test_papers_by_id_keep_order_and_name_the_unknown_ones(seed_rag, seed_titles):
    a, b = sorted(seed_titles)[:2]
    assert [p.paper_id for p in seed_rag.papers([b, a, b, f" {a} "])] == [b, a]
    assert seed_rag.papers(a)[0].title == seed_titles[a]
    with pytest.raises(InputError, match=r"unknown paper ids 'nope', 'zilch': not in the index"):
        seed_rag.papers([a, "nope", "zilch"])
    with pytest.raises(InputError, match="and 2 more"):
        seed_rag.papers([f"x{i}" for i in range(7)])
    for empty in ([], [" "], ""):
        with pytest.raises(InputError, match="no paper id given"):
            seed_rag.papers(empty)
    with pytest.raises(InputError, match="paper ids are text"):
        seed_rag.papers([1])


def test_papers_need_an_index(tmp_path):
    from rag import RAG
    from rag.errors import StoreError

    with pytest.raises(StoreError, match="there is no index at"):
        RAG(store_dir=tmp_path / "nowhere").papers(["x"])


# ---------------------------------------------------------------- 200 ICML 2026 records


def _icml_sample(n: int = 200) -> list[dict]:
    """Hard cases first (LaTeX specials in titles, non-ASCII names, no id), then evenly spaced
    others."""
    rows = icml_rows()
    special = [r for r in rows if re.search(r"[&%$#_{}~^\\]", r["title"])][:60]
    accents = [r for r in rows if any(re.search(r"[^\x00-\x7f]", a) for a in r["authors"])][:30]
    no_id = [r for r in rows if not r["id"]][:10]
    picked = {id(r): r for r in special + accents + no_id}
    for r in rows[:: len(rows) // n]:
        if len(picked) >= n:
            break
        picked.setdefault(id(r), r)
    return list(picked.values())


@pytest.fixture(scope="module")
def icml_sample_store(tmp_path_factory):
    """The 200 records indexed by the real ingest, with the hashing embedder (rag.testing): what is
    asserted of them is the metadata the store keeps and the citations made from it, not retrieval,
    and MiniLM's vectors of 200 abstracts were most of this fixture's time (~45 s on a busy CI
    machine)."""
    from rag import RAG
    from rag.testing import HashEmbedder

    tmp = tmp_path_factory.mktemp("icml_cite")
    sample = _icml_sample()
    path = write_jsonl(tmp / "icml_sample.jsonl", sample)
    rag = RAG(store_dir=tmp / "store", llm="none", embedder=HashEmbedder())
    report = rag.ingest([path])
    ids = [r.paper_id for r in parse_file(path).records]
    assert report.new_papers == len(set(ids)) == len(sample) == 200
    return rag, sample, ids


def test_icml_sample_is_valid_bibtex_with_its_fields_intact(icml_sample_store):
    rag, sample, ids = icml_sample_store
    text = format_citations(rag.papers(ids))
    entries = parse_bibtex(text)
    assert len(entries) == 200
    for row, entry in zip(sample, entries):
        check_entry(entry, row["title"], row["authors"], row["url"] or None)
        assert ("note" in entry.fields_dict) == (not row["url"])
        if not row["url"]:
            assert field(entry, "note") == "Metadata incomplete: url unknown"
    assert sum(1 for r in sample if re.search(r"[&%$#_{}~^\\]", r["title"])) >= 50
    assert (
        sum(1 for e in entries if "note" in e.fields_dict)
        == sum(1 for r in sample if not r["url"])
        >= 10
    )
    assert len({e.key for e in entries}) == 200
    # Shapes of the other formats for the same papers.
    ris = format_citations(rag.papers(ids), "ris")
    assert ris.count("TY  - CONF\n") == 200 and ris.count("ER  - \n") == 200
    assert ris.count("\nAU  - ") == sum(len(r["authors"]) for r in sample)
    md = format_citations(rag.papers(ids), "markdown").splitlines()
    assert len(md) == 200 and md[-1].startswith("200. ")


# ---------------------------------------------------------------- 678 ICML 2026 titles, through
# BibTeX


def _math_title(title: str) -> bool:
    return bool(re.search(r"[$\\]", title))


@pytest.fixture(scope="module")
def icml_bib() -> tuple[list[dict], str]:
    """The shipped ICML 2026 records (all 81 titles with LaTeX specials among them) as papers (no
    index needed: `format_citations` takes papers) and their BibTeX."""
    rows = icml_rows()
    return rows, format_citations(icml_papers(rows))


def icml_papers(rows: list[dict]) -> list[Paper]:
    return [
        Paper(
            r["id"] or f"row{i}",
            title=r["title"],
            authors=r["authors"],
            url=r["url"] or None,
            venue=r["venue"],
        )
        for i, r in enumerate(rows)
    ]


def test_all_icml_titles_read_back_as_written(icml_bib):
    rows, text = icml_bib
    assert len(rows) == 678 and sum(_math_title(r["title"]) for r in rows) == 69
    entries = parse_bibtex(text)
    assert len(entries) == 678
    for row, entry in zip(rows, entries):
        assert unlatex(field(entry, "title")) == plain(row["title"]), entry.key
        # no title word running into the year ("wang20262k")
        assert not re.search(r"\d{5}", entry.key), entry.key
    # pylatexenc (through bibtexparser) reads each math title's math as written and its \emph as its
    # text (math titles only: it takes 5 ms an entry).
    math_rows = [r for r in rows if _math_title(r["title"])]
    math_bib = format_citations([Paper(f"m{i}", title=r["title"]) for i, r in enumerate(math_rows)])
    decoded = bibtexparser.parse_string(
        math_bib, append_middleware=[middlewares.LatexDecodingMiddleware()]
    )
    assert [field(e, "title") for e in decoded.entries] == [
        plain(re.sub(r"\\emph\{([^{}]*)\}", r"\1", r["title"])) for r in math_rows
    ]
    # RIS and markdown carry what the title reads as: no LaTeX left.
    papers = [Paper(f"p{i}", title=r["title"]) for i, r in enumerate(rows)]
    ris_titles = re.findall(r"^TI  - (.*)$", format_citations(papers, "ris"), re.M)
    assert len(ris_titles) == 678 and not [t for t in ris_titles if re.search(r"[$\\]", t)]


def _bibtex_or_skip() -> str:
    bibtex = shutil.which("bibtex")
    if (
        bibtex is None
        or subprocess.run(["kpsewhich", "plain.bst"], capture_output=True).returncode != 0
    ):
        pytest.skip(
            "no bibtex with plain.bst: run scripts/install_test_deps.sh (installs Debian's"
            " texlive-base)"
        )
    return bibtex


def test_all_icml_titles_compile_with_bibtex_and_keep_their_math(icml_bib, tmp_path):
    """One run of a real BibTeX over the 678 ICML 2026 entries, the titles of broken LaTeX and the
    fuzzed ones: no error, no warning, and every math span of a title in the .bbl as written (its
    case kept by the braces: plain style lowercases titles)."""
    bibtex = _bibtex_or_skip()
    rows, _ = icml_bib
    extra = [title for title, _ in BROKEN_TITLES] + fuzz_titles()
    text = format_citations(
        icml_papers(rows)
        + [
            Paper(f"x{i}", title=t, authors=["Ann Lee"], venue="ICML 2026", url="u")
            for i, t in enumerate(extra)
        ]
    )
    (tmp_path / "refs.bib").write_text(text, encoding="utf-8")
    # What LaTeX writes for \nocite{*} \bibliographystyle{plain} \bibliography{refs} (no LaTeX
    # needed).
    (tmp_path / "paper.aux").write_text(
        "\\relax\n\\citation{*}\n\\bibstyle{plain}\n\\bibdata{refs}\n"
    )
    done = subprocess.run(
        [bibtex, "paper"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    blg = (tmp_path / "paper.blg").read_text(encoding="utf-8", errors="replace")
    assert done.returncode == 0, done.stdout + blg
    assert not re.search(r"error message|Warning--|I was expecting|I'm skipping", blg), blg
    bbl = (tmp_path / "paper.bbl").read_text(encoding="utf-8")
    assert bbl.count("\\bibitem{") == len(rows) + len(extra)
    # BibTeX wraps lines at spaces, or with a % where none
    bbl = " ".join(bbl.replace("%\n", "").split())
    math_titles = [r["title"] for r in rows if _math_title(r["title"])]
    spans = [m for t in math_titles for m in re.findall(r"\$[^$]+\$|\\emph\{[^{}]*\}", t)]
    assert len(spans) == 74
    missing = [s for s in spans if " ".join(s.split()) not in bbl]
    assert not missing, missing
    for title in (
        r"{$\textit{S}$-SPPO}: Semantic-calibrated",
        "{A$^2$SG}: Adaptive and asymmetric",
        "A {$k$-Means} interpretation",
        r"{$V_0$}: A generalist value model",
    ):
        assert title in bbl, title


# ---------------------------------------------------------------- the CLI


def test_cli_cite_prints_each_format_and_refuses_unknown_ids(seed_store, seed_meta):
    a, b = sorted(seed_meta)[:2]
    done = run_cli("cite", a, b, "--store", str(seed_store))
    assert done.returncode == 0, done.stderr
    entries = parse_bibtex(done.stdout)
    assert len(entries) == 2
    for paper_id, entry in zip((a, b), entries):
        check_entry(
            entry,
            seed_meta[paper_id]["title"],
            seed_meta[paper_id]["authors"],
            seed_meta[paper_id]["openreview_url"],
        )
    done = run_cli("cite", b, "--format", "markdown", "--store", str(seed_store))
    assert done.returncode == 0 and done.stdout.startswith("1. ") and done.stdout.count("\n") == 1
    done = run_cli("cite", a, "not-a-paper", "--format", "ris", "--store", str(seed_store))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("rag: error: unknown paper id 'not-a-paper': not in the index at")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    done = run_cli("cite", a, "--format", "bib", "--store", str(seed_store))
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_cli_ask_bibtex_prints_the_cited_papers_after_the_answer(seed_store, seed_meta, seed_rag):
    answer = seed_rag.ask(QUESTION, llm=False)
    cited = cited_paper_ids(answer)
    assert cited and cited == [s.paper_id for s in answer.sources if s.cited]
    done = run_cli("ask", QUESTION, "--no-llm", "--bibtex", "--store", str(seed_store))
    assert done.returncode == 0, done.stderr
    text, _, bib = done.stdout.partition("\n@")
    assert "References:" in text and f"forum?id={cited[0]}" in text
    entries = parse_bibtex("@" + bib)
    assert [unlatex(field(e, "title")) for e in entries] == [seed_meta[i]["title"] for i in cited]
    # The JSON shape stays as the contract says: --bibtex is for the text output.
    done = run_cli("ask", QUESTION, "--json", "--bibtex", "--store", str(seed_store))
    assert done.returncode == 2 and done.stdout == "" and "rag cite" in done.stderr


# ---------------------------------------------------------------- the UI


def test_citations_file_is_one_file_per_content(seed_rag, seed_titles):
    from rag.ui.app import citations_file  # imports Gradio: not at collection (3 s per worker)

    ids = sorted(seed_titles)[:3]
    path = citations_file(seed_rag, ids)
    assert path and Path(path).name == "citations.bib" and citations_file(seed_rag, ids) == path
    assert [unlatex(field(e, "title")) for e in parse_bibtex(Path(path).read_text())] == [
        seed_titles[i] for i in ids
    ]
    assert citations_file(seed_rag, ids[:1]) != path
    assert citations_file(seed_rag, []) is None and citations_file(seed_rag, ["no-such-id"]) is None


# ---------------------------------------------------------------- hostile urls in markdown

HOSTILE_URLS = [
    'https://openreview.net/forum?id=x1><img src="https://evil.example/p.png">',
    "https://openreview.net/forum?id=x1> ![t](https://evil.example/p.png) <b>bold</b>",
    "https://openreview.net/forum?id=x1)](https://evil.example/p.png)",
    "https://openreview.net/forum?id=x1\"'><script>alert(1)</script>",
    "https://openreview.net/forum?id=x1>\n\n<iframe src=https://evil.example></iframe>",
    "https://openreview.net/forum?id=x1` <img src=x onerror=alert(1)>",
    "javascript:alert(1)//<img src=https://evil.example/p.png>",
    "https://openreview.net/forum?id=x1><img/src=https://evil.example/p.png>",
]


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_markdown_url_cannot_break_out_into_an_image_or_html(url):
    """Rendered by a CommonMark renderer with raw HTML allowed: one line, no image, no HTML, and the
    link (when the url is http) is the paper's own address, still pointing at its host."""
    text = format_citations(
        [Paper("x1", title="A Paper", authors=["Ann Lee"], url=url, venue="ICML 2026")], "markdown"
    )
    assert text.count("\n") == 1, text
    for html in _rendered(text):
        assert not re.search(r"<(img|script|iframe|b)\b", html, re.I), html
        links = re.findall(r'<a href="([^"]*)"', html)
        if url.startswith("https://"):
            assert len(links) == 1 and links[0].startswith("https://openreview.net/forum?id=x1%"), (
                html
            )
        else:
            assert links == [], html  # not http: shown as text, not as a link


def _rendered(text: str) -> list[str]:
    """`text` as two markdown renderers turn it into HTML, raw HTML allowed: CommonMark
    (markdown-it) and Python-Markdown (which passes `<img/src=...>` through as a tag)."""
    import markdown
    from markdown_it import MarkdownIt

    return [MarkdownIt("commonmark", {"html": True}).render(text), markdown.markdown(text)]


def test_cli_cite_markdown_keeps_a_hostile_url_in_its_link(tmp_path):
    """`rag cite --format markdown` on a paper ingested with a url that closes the autolink and
    opens an image tag (no space in it, so it is taken as a url): rendered, no image and no HTML."""
    row = {
        "id": "hostile1",
        "title": "A Paper About Links",
        "authors": ["Ann Lee"],
        "abstract": "We study links in citations and show that they stay links.",
        "url": "https://openreview.net/forum?id=hostile1><img/src=https://evil.example/p.png>",
    }
    data = write_jsonl(tmp_path / "hostile.jsonl", [row])
    store = tmp_path / "store"
    done = run_cli("ingest", str(data), "--store", str(store))
    assert done.returncode == 0, done.stderr
    found = run_cli("search", "links in citations", "--json", "--store", str(store))
    (paper_id,) = {r["paper_id"] for r in json.loads(found.stdout)["results"]}
    done = run_cli("cite", paper_id, "--format", "markdown", "--store", str(store))
    assert done.returncode == 0, done.stderr
    for html in _rendered(done.stdout):
        assert "<img" not in html and "evil.example/p.png%3E" in html, html
