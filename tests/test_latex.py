"""rag.latex: abstracts' LaTeX as MathML or readable text, and nothing else gets through.

The browser side (MathML drawn in Chromium, in the chat and the sources panel) is in
tests/test_ui.py and tests/test_ui_hardening.py; here the HTML itself is checked, tag by tag and
attribute by attribute.
"""

from __future__ import annotations

import html
from html.parser import HTMLParser

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag.latex import (
    MAX_MATH,
    math_html,
    math_text,
    parse,
    plain_prose,
    shorten,
    to_html,
    to_text,
    typeset,
)

# What to_html may write: MathML Core (whitelisted in rag.latex), the text commands' markup, marks.
MATHML = set(
    """math mrow mi mn mo ms mtext mspace msup msub msubsup mfrac msqrt mroot mover munder
    munderover mtable mtr mtd mstyle mpadded mphantom menclose merror""".split()
)
TAGS = MATHML | {"em", "strong", "u", "code", "mark"}
ATTRIBUTES = {
    "display",
    "mathvariant",
    "form",
    "stretchy",
    "fence",
    "separator",
    "accent",
    "accentunder",
    "largeop",
    "movablelimits",
    "symmetric",
    "displaystyle",
    "lspace",
    "rspace",
    "width",
    "height",
    "depth",
    "voffset",
    "minsize",
    "maxsize",
    "linethickness",
    "scriptlevel",
    "columnalign",
    "rowalign",
    "columnlines",
    "rowlines",
    "notation",
}


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text, of an HTML fragment."""

    def __init__(self, fragment: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.ends: list[str] = []
        self.text: list[str] = []
        self.feed(fragment)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        self.ends.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def assert_safe(fragment: str) -> Tags:
    """Only whitelisted tags and attributes, with harmless values, balanced; nothing that loads or
    links."""
    parsed = Tags(fragment)
    for tag, attrs in parsed.tags:
        assert tag in TAGS, (tag, fragment)
        for name, value in attrs.items():
            assert name in ATTRIBUTES, (tag, name, fragment)
            assert value and all(ch.isalnum() or ch in " .-+%" for ch in value), (
                name,
                value,
                fragment,
            )
    assert sorted(t for t, _ in parsed.tags) == sorted(parsed.ends), fragment
    return parsed


def tags_of(fragment: str) -> list[str]:
    return [t for t, _ in Tags(fragment).tags]


# ---------------------------------------------------------------- math as MathML


def test_inline_math_becomes_mathml_and_its_dollars_go():
    out = to_html("neurons are faithful ( $ R^2=1 $ ) but unstable ( $ q^{\\star}=0.5 $% )")
    assert out.count('<math display="inline">') == 2 and "$" not in out
    assert "<msup><mi>R</mi><mn>2</mn></msup>" in out and "&#x22C6;" in out  # ⋆
    assert Tags(out).text[0] == "neurons are faithful ( " and out.endswith("</math>% )")
    for text in (
        "$\\mathcal{O}(n \\log n)$",
        "$\\epsilon$-greedy",
        "\\(k\\)-wise",
        "$y \\in \\mathcal{Y}^N$",
        "$\\widetilde{O}(\\widetilde{d}\\sqrt{\\kappa T})$",
        "$\\textit{S}$-SPPO",
        "a $>$50\\% rate",
        "$dist_{\\mathrm{CH}}(A,B) = \\sum_{a \\in A} \\min_{b \\in B} dist(a,b)$",
    ):
        out = to_html(text)
        assert "<math" in out and "$" not in out and "\\" not in out, (text, out)
        assert_safe(out)
    assert to_html("$$\\frac{a}{b}$$").startswith('<math display="block"><mrow><mfrac>')
    assert "𝒪" in html.unescape(to_html("$\\mathcal{O}(n)$"))


def test_dollars_that_are_not_math_stay_text():
    for text in (
        "costs $5 and $10",
        "from $5-$10 a month",
        "$5, which costs $ more",
        "pay $ 5 per day $ now",
        "only $0.01 per task.",
        "a single $ sign",
        "escaped \\$5 and \\$6",
        "$$ alone",
        "US$5 or $" + "x" * (MAX_MATH + 5) + "$",
    ):
        out = to_html(text)
        assert "<math" not in out, (text, out)
        assert html.unescape(out) == text.replace("\\$", "$"), out
    assert to_html("costs $5 and $10, but $x$ is math").count("<math") == 1


def test_text_commands_become_markup_or_text_and_never_links():
    assert (
        to_html("\\emph{very} \\textbf{bold} \\underline{u} \\texttt{code}")
        == "<em>very</em> <strong>bold</strong> <u>u</u> <code>code</code>"
    )
    assert to_html("ablating \\textbf{$\\sim$ 3%} of heads").startswith("ablating <strong><math")
    assert to_html("code at \\url{https://github.com/x/y}") == "code at https://github.com/x/y"
    assert to_html("\\href{javascript:alert(1)}{click here}") == "click here"
    assert to_html("50\\% of \\{x\\} \\& \\#1") == "50% of {x} &amp; #1"
    # shown as written
    assert to_html("\\emph{unclosed and \\cite{x}") == "\\emph{unclosed and \\cite{x}"
    assert (
        to_text("\\textit{\\textbf{Elastic}} $\\mathcal{O}(n \\log n)$, $ R^2=1 $")
        == "Elastic 𝒪(n log n), R²=1"
    )


def test_math_that_cannot_be_mathml_is_readable_text():
    # an unknown macro, nested text commands, broken LaTeX: no MathML, no raw markup, no backslashes
    assert to_html("$\\TC^0$ circuits") == "TC⁰ circuits"
    assert to_html("$\\texttt{\\textbf{AsyncSpade}}$") == "<code><strong>AsyncSpade</strong></code>"
    assert to_html("$\\textbf{90.4\\%}$") == "<strong>90.4%</strong>"
    assert to_html("$x_{$ and") == "x_ and"
    assert to_html("$\\url{http://e.example/x}$") == "&lt;http://e.example/x&gt;"
    assert (
        math_html("\\text{<b>x</b>}") is None
        and to_html("$\\text{<b>x</b>}$") == "&lt;b&gt;x&lt;/b&gt;"
    )
    assert (
        math_text("\\tilde{\\mathcal{O}}((\\alpha^{-1} + \\varepsilon^{-1})/\\gamma^2)")
        == "𝒪̃((α⁻¹ + ε⁻¹)/γ²)"
    )


def test_poisoned_latex_gives_no_element_link_style_or_url():
    poison = [
        "$<img src=x onerror=alert(1)>$",
        "$\\href{javascript:alert(1)}{x}$",
        "\\url{javascript:alert(1)}",
        "$\\url{http://evil.example/u}$",
        "$\\style{background:url(http://evil.example/s.png)}{y}$",
        "$\\text{<img src=http://evil.example/t.png>}$",
        "$\\text{<b onclick=alert(1)>b</b>}$",
        "$\\class{x}{y}$ $\\htmlClass{x}{y}$ $\\htmlData{x=1}{y}$",
        "$\\color{red}{x}$ $\\mathcolor{red}{x}$",
        "$\\includegraphics{http://evil.example/g.png}$",
        "$\\text{<!DOCTYPE x [<!ENTITY a 'b'>]>}$",
        "$\\text{&lt;script&gt;}$ $\\mathrm{&#x3C;img&#x3E;}$",
        "$\\begin{array}{c}<svg onload=alert(1)>\\end{array}$",
        "\\emph{<script>alert(1)</script>}",
        '$x$"><img src=x onerror=alert(1)>$y$',
        "$\\operatorname{<a href=javascript:alert(1)>}$",
        "$\\mathbb{<iframe>}$",
        '$$<math><mi href="x">a</mi></math>$$',
    ]
    for text in poison:
        # MathML and text markup only: no href, style, src or on* attribute
        assert_safe(to_html(text))
    # latex2mathml writes href= and style= for these; the whitelist keeps the math and drops them
    assert (
        to_html("$\\href{javascript:alert(1)}{x}$")
        == '<math display="inline"><mrow><mrow><mrow><mi>x</mi>'
        "</mrow></mrow></mrow></math>"
    )
    assert "<mi>y</mi>" in to_html("$\\style{background:url(http://evil.example/s.png)}{y}$")
    assert to_html("\\url{javascript:alert(1)}") == "javascript:alert(1)"  # a URL is only ever text


def test_marks_grow_to_hold_the_math_they_cut_into():
    text = "Tail. Neurons are faithful ( $ R^2=1 $ ) here."
    cut = text.index("R^2")  # a mark ending inside the math
    out = to_html(text, marks=[(6, cut)], mark=("<mark>", "</mark>"))
    assert (
        out.startswith("Tail. <mark>Neurons are faithful ( <math")
        and "</math></mark> ) here." in out
    )
    out = to_html(text, marks=[(cut, len(text))])
    assert "( <mark><math" in out and out.endswith("here.</mark>")
    assert to_html("a b c", marks=[(0, 1), (4, 5)]) == "<mark>a</mark> b <mark>c</mark>"
    assert to_html("x <y> & z", marks=[(2, 5)]) == "x <mark>&lt;y&gt;</mark> &amp; z"


def test_shorten_never_cuts_inside_math():
    title = "A title with $\\mathcal{O}(n \\log n)$ math"
    assert shorten(title, 20) == "A title with…" and shorten(title, 100) == title
    assert shorten("  spaced\n out  ", 20) == "spaced out"


def test_parse_is_linear_on_hostile_input():
    import time

    for text in (
        "\\emph{" * 20_000,
        "$" * 50_000,
        "\\(" * 30_000,
        "$a " * 30_000,
        "{" * 50_000 + "$x$",
    ):
        start = time.perf_counter()
        parse(text)
        assert time.perf_counter() - start < 5, text[:10]


# ---------------------------------------------------------------- any input

PIECES = st.sampled_from(
    [
        "$",
        "$$",
        "\\(",
        "\\)",
        "{",
        "}",
        "\\",
        "^",
        "_",
        " ",
        "x",
        "5",
        "<",
        ">",
        "&",
        '"',
        "'",
        "\\href{javascript:alert(1)}{x}",
        "\\url{http://e.example}",
        "\\text{",
        "\\emph{",
        "\\frac",
        "\\mathcal{O}",
        "<img src=x onerror=alert(1)>",
        "\\style{color:red}",
        "%",
        "\\%",
        "\\textbf{",
        "\\sqrt",
        "\\mathrm{",
        "\\\\",
        "\n",
        "&#x3C;",
        "\\begin{matrix}",
        "a&b",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=30).map("".join))
def test_any_input_gives_only_whitelisted_markup(text):
    out = to_html(text)
    assert_safe(out)
    marked = to_html(text, marks=[(0, len(text) // 2)])
    assert_safe(marked)
    assert "<" not in to_text(text) or "<" in text or "\\url" in text


def test_wide_accents_keep_their_mark_as_text():
    """`\\widetilde{d}` is the effective dimension, not the feature dimension d: the mark must
    survive."""
    from rag import latex

    assert latex.to_text(r"grows with $\widetilde{d}$, not $d$") == "grows with d̃, not d"
    assert latex.to_text(r"$\widehat{\theta}$") == "θ̂"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("the ``lessons'' learned", "the \u201clessons\u201d learned"),
        ("a `single' quote", "a \u2018single\u2019 quote"),
        ("10--20 runs --- and more", "10\u201320 runs \u2014 and more"),
        (
            "na\\\"ive caf\\'e, G\\\"{o}del, \\c{c}a, {\\'e}t\\'{e}, \\v{s}",
            "na\u00efve caf\u00e9, G\u00f6del, \u00e7a, \u00e9t\u00e9, \u0161",
        ),
    ],
)
def test_text_mode_latex_reads_as_its_characters(raw, shown):
    assert to_text(raw) == shown
    assert plain_prose(raw) == shown
    assert to_html(raw) == html.escape(shown)


@given(st.text(alphabet=st.characters(blacklist_characters="\\`'-{}$")))
def test_text_without_latex_marks_is_left_alone(text):
    assert typeset(text) == text
