"""The chat UI: rendering is escaped, and a real browser gets streamed, cited answers.

Browser tests drive Debian's /usr/bin/chromium with Playwright (never `playwright install`; the
session's `browser` fixture, tests/browser.py); they are skipped, with the reason, only where
chromium or playwright is missing and CI is not set. LLM-backed browser tests are in
tests/test_ui_llm.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from rag.config import RETRIEVAL_MODES
from rag.errors import InputError
from rag.models import Answer, AnswerStream, Citation, Source
from rag.net import is_loopback
from rag.ui.app import (
    ADVANCED_MODE_CHOICES,
    EXAMPLES,
    MODE_CHOICES,
    corpus_examples,
    header_text,
    launch,
)
from rag.ui.render import (
    highlight,
    md_math,
    md_text,
    render_answer,
    render_reply,
    render_sources,
    render_turn_sources,
)
from rag.ui.security import CSP, parse_auth
from tests.browser import ARTIFACTS, chromium, needs_browser  # noqa: F401 (re-exported)
from tests.servers import free_port

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

QUESTION = "How does Palimpsa relate to Mamba2?"
HOSTILE_TITLE = "Learning <script>window.pwned=1</script> & Forgetting"
HOSTILE_PASSAGE = (
    'We propose <img src="{evil}" onerror="window.pwned=2"> Palimpsa <b>bold</b>. It forgets.'
)
CURSOR = "\u258c"
# Math as abstracts write it, and LaTeX that tries to become markup, a link or a request.
MATH_ANSWER = (
    "Neurons are faithful ( $ R^2=1 $ ) [1] in $\\mathcal{{O}}(n \\log n)$ time; it costs $5 and"
    " $10 [2]. {poison}"
)
MATH_PASSAGE = (
    "Atoms of LLMs. We find that neurons are faithful ( $ R^2=1 $ ) but unstable ( $ q^{\\star}=0.5"
    " $% ). Pricing: $5 and $10."
)
MATH_TITLE = "Towards Atoms: $q^{\\star}$ and \\emph{faithful} units"
LATEX_POISON = (
    "$<img src={evil}?a onerror=window.pwned=5>$ $\\href{{javascript:window.pwned=6}}{{x}}$"
    " \\href{{javascript:window.pwned=7}}{{click}} \\url{{{evil}?u}}"
    " $\\style{{background:url({evil}?s)}}{{y}}$ $\\text{{<img src={evil}?t"
    " onerror=window.pwned=8>}}$ $\\url{{{evil}?m}}$"
)
# A model's answer as models write it: LaTeX escapes, math, a text command and markdown emphasis.
TEX_ANSWER = (
    "Accuracy rose to 95\\% [1] with a $2\\times$ speedup; \\textbf{bold claim}, **Palimpsa** is"
    " *fast* and <b>x</b> stays text. Done."
)
# Deadlines for a busy 2-core CI machine (an answer took over 60 s there once); a pass is much
# faster.
DEADLINE_MS = 180_000


class FakeRAG:
    """Stands in for RAG where a test needs hostile model output, a gate, or an unsupported
    citation.

    The answer echoes the question and the length of the history it was given. Questions starting
    with "together" wait at a barrier until two of them are being answered at the same time;
    questions starting with "gated" stop after their first word until `gate` is set.
    """

    def __init__(self, port: int, evil_url: str, auth: str | None = None) -> None:
        self.settings = SimpleNamespace(
            llm_backend="none",
            llm_model="-",
            top_k=5,
            mode="hybrid",
            ui_host="127.0.0.1",
            ui_port=port,
            ui_auth=auth,
        )
        self.evil_url = evil_url
        self.barrier = threading.Barrier(2)
        self.gate = threading.Event()
        self.gate.set()
        self.active = self.peak = 0
        self._lock = threading.Lock()
        self.modes: dict[str, str] = {}  # question -> the retrieval mode the page asked for

    def stats(self) -> dict:
        return {"papers": 3, "chunks": 3}

    def papers(self, paper_ids) -> list:  # what the "Export citations (BibTeX)" download cites
        from rag.index.corpus import Paper

        return [
            Paper(
                i,
                title=HOSTILE_TITLE,
                authors=["A <i>B</i>"],
                url=f"https://openreview.net/forum?id={i}",
                venue="ICML 2026",
            )
            for i in paper_ids
        ]

    def stream(self, question, k=5, mode="hybrid", llm=True, history=None) -> AnswerStream:
        self.modes[question] = mode
        if question.startswith("math"):
            return AnswerStream(self._math_pieces(question))
        if question.startswith("tex"):
            return AnswerStream(self._tex_pieces(question))
        if question.startswith("reading"):
            return AnswerStream(self._reading_pieces(question))
        return AnswerStream(self._pieces(question, history))

    def _reading_pieces(self, question):
        """A model's stream as the engine gives it: the papers found (`Reading`), a wait at `gate`
        while the model reads, `Writing`, then the checked text whole."""
        from rag import Reading, Writing

        found = [_src(n, title=f"Found {t}", cited=False) for n, t in ((1, "first"), (2, "second"))]
        yield Reading(found, 12.0)
        self.gate.wait(timeout=DEADLINE_MS / 1000)
        yield Writing(1)
        text = "The first paper says so [1]."
        yield text
        return Answer(
            question=question,
            answer=text,
            mode="llm",
            sources=[found[0].model_copy(update={"cited": True}), found[1]],
            citations=[Citation(n=1, paper_id="p1", supported=True)],
        )

    def _math_pieces(self, question):
        """An answer, a title and a passage holding math, prices and poisoned LaTeX."""
        poison = LATEX_POISON.format(evil=self.evil_url)
        text = MATH_ANSWER.format(poison=poison)
        for word in text.split(" "):
            yield word + " "
        return Answer(
            question=question,
            answer=text,
            mode="llm",
            sources=[
                Source(
                    n=1,
                    paper_id="p1",
                    title=MATH_TITLE,
                    authors=["A"],
                    url="https://openreview.net/forum?id=p1",
                    score=0.9,
                    passage=MATH_PASSAGE,
                    cited=True,
                    evidence=[MATH_PASSAGE.split(". ")[1] + "."],
                ),
                Source(
                    n=2,
                    paper_id="p2",
                    title=f"Poisoned {poison}",
                    url=None,
                    score=0.5,
                    cited=True,
                    passage=f"A passage with {poison} in it.",
                    evidence=[f"A passage with {poison} in it."],
                ),
            ],
            citations=[
                Citation(n=1, paper_id="p1", supported=True),
                Citation(n=2, paper_id="p2", supported=True),
            ],
        )

    def _tex_pieces(self, question):
        """A model answer written in LaTeX and markdown; it waits at `gate` before its last piece,
        so a test sees the streamed text as the page shows it mid-answer."""
        for piece in TEX_ANSWER.split(" ")[:-1]:
            yield piece + " "
        self.gate.wait(timeout=DEADLINE_MS / 1000)
        yield TEX_ANSWER.split(" ")[-1]
        return Answer(
            question=question,
            answer=TEX_ANSWER,
            mode="llm",
            sources=[
                Source(
                    n=1,
                    paper_id="p1",
                    title="A title with 95\\% and **stars**",
                    url=None,
                    score=0.9,
                    passage="Accuracy rose to 95\\% with a $2\\times$ speedup.",
                    cited=True,
                )
            ],
            citations=[Citation(n=1, paper_id="p1", supported=True)],
        )

    def _pieces(self, question, history):
        if question == "boom":
            raise InputError("question <b>rejected</b>; rephrase it")
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if question.startswith("together"):
                # BrokenBarrierError unless both run at once
                self.barrier.wait(timeout=DEADLINE_MS / 1000)
            text = (
                f"Palimpsa <b>generalises</b> Mamba2 [1] ![pixel]({self.evil_url}) [2]. "
                f"asked={question} turns={len(history or [])}"
            )
            for i, word in enumerate(text.split(" ")):
                yield word + " "
                if i == 0 and question.startswith("gated"):
                    self.gate.wait(timeout=DEADLINE_MS / 1000)
                time.sleep(0.01)
        finally:
            with self._lock:
                self.active -= 1
        return Answer(
            question=question,
            answer=text,
            mode="llm",
            grounding=0.5,
            sources=[
                Source(
                    n=1,
                    paper_id="p1",
                    title=HOSTILE_TITLE,
                    authors=["A <i>B</i>"],
                    url="https://openreview.net/forum?id=p1",
                    score=0.9,
                    passage=HOSTILE_PASSAGE.format(evil=self.evil_url),
                    cited=True,
                    evidence=[HOSTILE_PASSAGE.format(evil=self.evil_url).split(". ")[0] + "."],
                ),
                Source(
                    n=2,
                    paper_id="p2",
                    title=f"Second, for {question}",
                    url=None,
                    score=0.5,
                    passage="x",
                    cited=True,
                ),
                Source(
                    n=3,
                    paper_id="p3",
                    title="Uncited",
                    url="javascript:alert(1)",
                    score=0.1,
                    passage="y",
                    cited=False,
                ),
            ],
            citations=[
                Citation(n=1, paper_id="p1", supported=True),
                Citation(n=2, paper_id="p2", supported=False),
            ],
        )


def _src(n, **kw) -> Source:
    return Source(
        **{
            "n": n,
            "paper_id": f"p{n}",
            "title": f"T{n}",
            "url": None,
            "score": 0.5,
            "passage": "",
            "cited": True,
            **kw,
        }
    )


# ---------------------------------------------------------------- rendering, no browser


def test_model_text_cannot_inject_markup_images_or_links():
    out = md_text("<img src=x onerror=alert(1)> ![i](http://e.com/i.png) [a](http://e.com) `c` $x$")
    assert "<img" not in out and "&lt;img" in out
    assert "![" not in out and "](" not in out.replace("\\](", "") and "\\`" in out and "\\$" in out
    # no autolinks either: bare URLs, www. names and e-mail addresses stay text
    out = md_text("see http://e.com/?q=secret www.e.com me@e.com")
    assert "://" not in out and "www." not in out and "@" not in out
    assert out == "see http&#58;//e.com/?q=secret www&#46;e.com me&#64;e.com"


def test_markers_link_to_their_turns_card_and_unknown_ones_stay_text():
    srcs = [
        _src(1, title='T "q"', url="https://openreview.net/forum?id=a"),
        _src(2, title="U", url="javascript:alert(1)"),
    ]
    out = render_answer("A [1]. B [2]. C [1, 2]. D [9].", srcs, turn=3)
    # To the card in the Sources panel, whose title links to the paper; never away from the chat.
    assert out.count('href="#src-3-1"') == 2 and "openreview" not in out and "_blank" not in out
    assert out.count('href="#src-3-2"') == 2 and "javascript" not in out
    assert "\\[9\\]" in out and 'title="T &quot;q&quot;"' in out


def test_unsupported_citations_are_flagged_in_the_marker_the_references_and_the_card():
    answer = Answer(
        question="q",
        answer="Claim one [1]. Claim two [2].",
        mode="llm",
        grounding=0.5,
        sources=[_src(1, url="https://openreview.net/forum?id=a"), _src(2), _src(3, cited=False)],
        citations=[
            Citation(n=1, paper_id="p1", supported=True),
            Citation(n=2, paper_id="p2", supported=False),
        ],
    )
    reply = render_reply(answer, turn=1)
    assert reply.count('class="cite unsupported"') == 1 and reply.count('class="cite"') == 1
    body, refs = reply.split("**References**")
    assert '\\[1\\] <a class="ref" href="https://openreview.net/forum?id=a"' in refs
    # uncited: panel only
    assert '\\[2\\] T2 <span class="flag-unsupported">' in refs and "T3" not in refs
    assert "50% of the claims are backed by the passages they cite" in body
    panel = render_turn_sources(answer, 1)
    assert panel.count("src-unsupported") == 1 and panel.count("⚠ citation not supported") == 1
    assert 'id="src-1-2"' in panel and 'data-turn="1"' in panel


def test_llm_error_is_the_first_line_of_the_reply():
    answer = Answer(
        question="q",
        answer="Extracted [1].",
        mode="extractive",
        sources=[_src(1)],
        citations=[Citation(n=1, paper_id="p1", supported=True)],
        error="the LLM server answered 503 <b>x</b>; check OPENAI_BASE_URL",
    )
    reply = render_reply(answer)
    assert reply.startswith("⚠️ **LLM failed:** the LLM server answered 503 &lt;b&gt;x&lt;/b&gt;")


def test_llm_answers_that_cite_nothing_say_so():
    bare = Answer(
        question="q",
        answer="A claim with no marker.",
        mode="llm",
        grounding=0.0,
        uncited_sentences=["A claim with no marker."],
        sources=[_src(1, cited=False)],
    )
    assert "⚠ this answer cites no paper" in render_reply(
        bare
    ) and "References" not in render_reply(bare)
    partly = bare.model_copy(
        update={
            "answer": "Cited [1]. Not cited.",
            "sources": [_src(1)],
            "citations": [Citation(n=1, paper_id="p1", supported=True)],
            "uncited_sentences": ["Not cited."],
            "grounding": 0.5,
        }
    )
    assert "⚠ 1 sentence cites no paper" in render_reply(partly)
    abstained = bare.model_copy(update={"abstained": True})
    assert "⚠" not in render_reply(abstained)


def test_evidence_is_highlighted_after_escaping():
    passage = "Intro <b>x</b>.  The  method\tworks <script>a()</script>. Tail & end. Last one."
    out, missing = highlight(
        passage, ["The method works <script>a()</script>.", "Tail & end.", "Not in the passage."]
    )
    assert "<script>" not in out and "<b>" not in out
    assert out.count('<mark class="evidence">') == 1  # adjacent sentences merge into one mark
    assert (
        '<mark class="evidence">The  method\tworks &lt;script&gt;a()&lt;/script&gt;. Tail &amp;'
        " end.</mark>" in out
    )
    assert out.startswith("Intro &lt;b&gt;x&lt;/b&gt;.") and missing == ["Not in the passage."]
    card = render_sources(
        [_src(1, passage="T1\nBody one. Body two.", evidence=["Body two.", "T1", "Elsewhere."])]
    )
    assert (
        '<div class="src-passage">Body one. <mark class="evidence">Body two.</mark></div>' in card
    )
    assert 'Supporting sentence: <mark class="evidence">Elsewhere.</mark>' in card  # not the title


def test_markdown_emphasis_in_a_passage_is_drawn_not_shown_as_asterisks():
    out, _ = highlight(
        "a **F**unction-**I**nformed design, *in vivo*, 2 * 3 * 4 and **<b>x</b>**", []
    )
    assert (
        "<strong>F</strong>unction-<strong>I</strong>nformed" in out and "<em>in vivo</em>" in out
    )
    assert (
        "2 * 3 * 4" in out and "<strong>&lt;b&gt;x&lt;/b&gt;</strong>" in out and "<b>" not in out
    )


def test_math_in_answers_titles_and_passages_becomes_mathml_and_prices_stay_text():
    fake = FakeRAG(0, "http://127.0.0.1:9/evil.png")
    answer = fake.stream("math q").answer
    reply = render_reply(answer, turn=1)
    body, refs = reply.split("**References**")
    assert body.startswith(
        'Neurons are faithful ( <math display="inline"><mrow><msup><mi>R</mi><mn>2</mn>'
    )
    # a price stays text (escaped for markdown)
    assert "costs \\$5 and \\$10" in body and "$ R^2" not in body
    assert "Towards Atoms: <math" in refs and "<em>faithful</em>" in refs
    # a tooltip takes no markup: Unicode
    assert 'title="Towards Atoms: q^(⋆) and faithful units"' in body
    card = render_turn_sources(answer, 1)
    # 3 in card 1, 4 in the poisoned one
    assert card.count("<math") == 7 and "Pricing: $5 and $10." in card
    # the evidence mark wraps the sentence with its math, not a piece of it
    assert '<mark class="evidence">We find that neurons are faithful ( <math' in card
    assert "</math>% ).</mark> Pricing" in card
    assert (
        md_math("$x$ costs $5 and $10")
        == '<math display="inline"><mrow><mi>x</mi></mrow></math> costs \\$5 and \\$10'
    )
    # the rest: as before
    assert md_math("*a* [b](http://e.com) `c`") == md_text("*a* [b](http://e.com) `c`")


def test_retrieval_choices_are_words_for_every_engine_mode():
    values = [v for _, v in MODE_CHOICES + ADVANCED_MODE_CHOICES]
    assert sorted(values) == sorted(RETRIEVAL_MODES) and len(values) == len(set(values))
    assert MODE_CHOICES[0] == ("Meaning + keywords (recommended)", "hybrid")
    assert {v for _, v in ADVANCED_MODE_CHOICES} == {"hybrid-rrf", "hybrid-convex"}
    # no internal names shown
    assert not any(v in label for label, v in MODE_CHOICES + ADVANCED_MODE_CHOICES)


def test_sources_panel_escapes_and_splits_cited_from_uncited():
    fake = FakeRAG(0, "http://127.0.0.1:9/evil.png")
    answer = fake.stream("q").answer
    out = render_sources(answer.sources)
    assert "<script>" not in out and "&lt;script&gt;" in out and "<img" not in out
    assert (
        out.index("Cited papers (2)") < out.index("Retrieved, not cited (1)") < out.index("Uncited")
    )
    # a source retrieval did not make: its one score
    assert "javascript:" not in out and "score 0.90" in out
    assert "appear here" in render_sources([])


def test_sources_panel_says_what_each_papers_place_is_made_of(seed_rag):
    """A cited paper's card follows the answer's order, so it says where retrieval put it; the
    number that order follows (fused) and the cosine and keyword matches beside it are each named.
    """
    answer = seed_rag.ask("How does Palimpsa relate to Mamba2?")
    out = render_sources(answer.sources)
    shown = re.findall(
        r'<span class="src-scores" title="[^"]*">retrieved #(\d+) · fused (\d\.\d\d) · '
        r"cosine (-?\d\.\d\d) · keyword (\d+\.\d)</span>",
        out,
    )
    assert len(shown) == len(answer.sources), out
    by_rank = sorted((int(rank), float(fused)) for rank, fused, _, _ in shown)
    assert [rank for rank, _ in by_rank] == list(range(1, len(shown) + 1))
    assert [fused for _, fused in by_rank] == sorted((fused for _, fused in by_rank), reverse=True)
    assert not re.search(r"(similarity|score) \d", out)  # no number without its name


def test_header_names_corpus_size_and_model_in_sentences():
    fake = FakeRAG(0, "")
    header = header_text(fake)
    assert (
        "**3** papers indexed" in header
        and "No language model is set up, so answers are sentences quoted" in header
    )
    # not a log line
    assert "RAG\\_LLM=local or OPENAI\\_BASE\\_URL" in header and "extractive:" not in header
    fake.settings.llm_backend, fake.settings.llm_model = "openai", "gpt-4o-mini"
    assert "Answers are written by **gpt-4o-mini** (openai)." in header_text(fake)
    fake.settings.llm_backend, fake.settings.local_model_path = "local", Path("/models/tiny.gguf")
    assert "Answers are written by the local model **tiny.gguf**." in header_text(fake)


def test_model_answer_text_renders_latex_and_emphasis_and_nothing_else():
    shown = render_answer(
        "Up 95\\% [1]: $2\\times$, \\textbf{b}, **B**, *i*, _u_, ~~d~~, <b>x</b>, 2*3*4", [_src(1)]
    )
    assert "95%" in shown and "\\%" not in shown and "<math" in shown and "\\times" not in shown
    assert "<strong>b</strong>" in shown and "<strong>B</strong>" in shown and "<em>i</em>" in shown
    # as written
    assert "\\_u\\_" in shown and "\\~\\~d\\~\\~" in shown and "&lt;b&gt;x&lt;/b&gt;" in shown
    assert "2\\*3\\*4" in shown  # a product is no emphasis
    assert (
        render_answer("**<img src=x onerror=alert(1)>**", [])
        == "<strong>&lt;img src=x onerror=alert(1)&gt;</strong>"
    )


def test_examples_are_questions_about_indexed_papers(seed_rag):
    titles = {
        s.title
        for s in seed_rag.search(
            "we propose a new method model learning results", k=20, mode="bm25"
        )
    }
    examples = corpus_examples(seed_rag)
    assert len(examples) == 3 and len(set(examples)) == 3
    assert all(any(f"“{t}”" in e for t in titles) for e in examples), examples
    assert corpus_examples(FakeRAG(0, "")) == EXAMPLES  # no store to draw from


def test_login_setting_and_bind_address(monkeypatch):
    assert (
        parse_auth("alice:pa:ss") == ("alice", "pa:ss")
        and parse_auth(None) is None
        and parse_auth(" ") is None
    )
    for bad in ("alice", ":pw", "alice:"):
        with pytest.raises(InputError, match="user:password"):
            parse_auth(bad)
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    from rag.config import Settings

    assert Settings().ui_host == "127.0.0.1"
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7999")
    monkeypatch.setenv("RAG_UI_AUTH", "bob:pw")
    s = Settings()
    assert (s.ui_host, s.ui_port) == ("0.0.0.0", 7999)
    assert parse_auth(s.ui_auth) == ("bob", "pw")  # RAG_UI_AUTH is read by Settings alone


# ---------------------------------------------------------------- browser helpers


def open_page(browser, url, wait_for_chat=True):
    """A page in its own browser context (its own cookies: a separate person); requests recorded."""
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(DEADLINE_MS)  # goto, clicks and waits alike
    page = context.new_page()
    page.requests = []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("close", lambda _: context.close())
    response = page.goto(url)
    if wait_for_chat:
        page.locator("#question textarea").wait_for(timeout=DEADLINE_MS)
    return page, response


def send(page, question):
    box = page.locator("#question textarea")
    box.fill(question)
    box.press("Enter")


def wait_turn(page, turn, timeout=DEADLINE_MS):
    """Until answer `turn` is final (no streaming cursor) and the panel shows that turn's
    sources."""
    page.wait_for_function(
        "n => { const b = document.querySelectorAll('#chat [data-testid=bot]'); const p ="
        " document.querySelector('#sources .src-panel'); return b.length >= n && !b[n -"
        " 1].innerText.includes('\u258c') && p && p.dataset.turn === String(n) &&"
        " !p.innerText.includes('Finding sources'); }",
        arg=turn,
        timeout=timeout,
    )
    return page.locator("#chat [data-testid=bot]").nth(turn - 1)


def ask(page, question, turn=1):
    send(page, question)
    return wait_turn(page, turn)


def show_turn(page, turn):
    """Switch the sources panel to an earlier answer with the "Sources for answer" selector."""
    page.locator("#turn-pick label").nth(turn - 1).click()
    page.wait_for_function(
        f"document.querySelector('#sources .src-panel')?.dataset.turn === '{turn}'",
        timeout=DEADLINE_MS,
    )


def nothing_ran_or_loaded(page, base_url, screenshot):
    """No planted script ran and nothing left loopback (after giving a stray load a moment to
    show)."""
    assert page.evaluate("window.__pwned") is None
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / screenshot), full_page=True)
    assert not [u for u in page.requests if "evil.example" in u]
    assert_loopback_only(page, base_url)
    page.close()


def assert_loopback_only(page, base_url):
    left = [u for u in page.requests if not u.startswith((base_url, "data:", "blob:"))]
    assert left == [], f"requests left the machine: {left}"


# ---------------------------------------------------------------- browser: FakeRAG


@pytest.fixture(scope="module")
def fake():
    """A FakeRAG served by `launch` with host and port taken from its settings."""
    port = free_port()
    rag = FakeRAG(port, f"http://127.0.0.1:{free_port()}/evil.png")
    demo = launch(rag, block=False)
    rag.url, rag.demo = f"http://127.0.0.1:{port}/", demo
    yield rag
    demo.close()


@needs_browser
def test_browser_shows_hostile_model_output_as_text_and_flags_unsupported(browser, fake):
    page, response = open_page(browser, fake.url)
    assert "default-src 'self'" in response.headers["content-security-policy"]
    bot = ask(page, "anything")
    text = bot.inner_text()
    assert (
        "<b>generalises</b>" in text
        and f"![pixel]({fake.evil_url})" in text
        and "References" in text
    )
    assert bot.locator("a:not(.cite):not(.ref)").count() == 0  # the URL in the answer is not a link
    assert (
        bot.locator("a.cite.unsupported").count() == 1
        and bot.locator(".flag-unsupported").count() == 2
    )
    panel = page.locator("#sources")
    assert HOSTILE_TITLE in panel.inner_text() and "<img src=" in panel.inner_text()
    assert page.locator("#sources .src-card.src-unsupported").count() == 1
    mark = page.locator("#sources mark.evidence")
    assert mark.count() == 1 and mark.inner_text().startswith("We propose <img src=")
    assert (
        page.locator("#chat img, #sources img, #sources script, #sources b, #chat b").count() == 0
    )
    assert page.evaluate("window.pwned") is None
    assert not [u for u in page.requests if "evil.png" in u]
    page.screenshot(path=str(ARTIFACTS / "ui_hostile_output.png"))
    assert (
        ask(page, "boom", turn=2).inner_text().strip() == "⚠️ question <b>rejected</b>; rephrase it"
    )
    assert "No sources: question <b>rejected</b>" in panel.inner_text()
    assert_loopback_only(page, fake.url)
    page.close()


@needs_browser
def test_browser_two_sessions_at_once_see_only_their_own_turns(browser, fake):
    one, _ = open_page(browser, fake.url)
    two, _ = open_page(browser, fake.url)
    fake.peak = 0
    send(one, "together alpha")
    send(two, "together beta")  # both are answered at once (the barrier needs two), or both fail
    for page, mine, theirs in ((one, "alpha", "beta"), (two, "beta", "alpha")):
        text = wait_turn(page, 1).inner_text()
        assert f"asked=together {mine}" in text and "turns=0" in text, text
        chat, panel = page.locator("#chat").inner_text(), page.locator("#sources").inner_text()
        assert (
            theirs not in chat and theirs not in panel and f"Second, for together {mine}" in panel
        )
    assert fake.peak == 2
    # Each session's history is its own: a follow-up in one reaches rag with one's turn only.
    assert "turns=2" in ask(one, "follow-up", turn=2).inner_text()
    assert "turns=4" in ask(one, "another", turn=3).inner_text()
    assert "turns=2" in ask(two, "fresh", turn=2).inner_text()  # two's own turn only
    one.locator("#clear").click()
    one.wait_for_function("!document.querySelector('#chat [data-testid=bot]')", timeout=DEADLINE_MS)
    assert "turns=0" in ask(one, "after clear").inner_text()
    assert two.locator("#chat [data-testid=bot]").count() == 2
    one.close(), two.close()


MATH_JS = """() => { const m = document.querySelector('#chat [data-testid=bot] msup');
    const [base, sup] = [...m.children].map(e => e.getBoundingClientRect());
    return {raised: sup.top < base.top, width: m.closest('math').getBoundingClientRect().width}; }"""


@needs_browser
def test_browser_shows_math_as_math_in_the_chat_and_the_sources(browser, fake):
    page, _ = open_page(browser, fake.url)
    bot = ask(page, "math, please")
    text = bot.inner_text()
    # R^2, and the title's q^*
    assert bot.locator("math").count() >= 4 and bot.locator("math msup").count() >= 2
    assert "$ R^2" not in text and "\\mathcal" not in text and "it costs $5 and $10" in text
    # Chromium draws it: the 2 of R^2 is raised, the formula has a width
    layout = page.evaluate(MATH_JS)
    assert layout["raised"] and layout["width"] > 10, layout
    card = page.locator("#sources .src-card").first
    assert (
        card.locator(".src-title math").count() == 1
        and card.locator(".src-title em").inner_text() == "faithful"
    )
    # the highlighted sentence keeps its math
    assert card.locator("mark.evidence math").count() == 2
    assert "Pricing: $5 and $10." in card.inner_text() and "$ R^2" not in card.inner_text()
    assert "q^(⋆)" in bot.locator("a.cite").first.get_attribute("title")  # a tooltip: readable text
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / "ui_math.png"), full_page=True)
    page.close()


def rendered(message) -> dict:
    """What a chat message shows: its text, and its math, bold and italic elements."""
    return {
        "text": message.inner_text(),
        "math": message.locator("math").count(),
        "strong": [t for t in message.locator("strong").all_inner_texts() if t != "References"],
        "em": message.locator("em").all_inner_texts(),
    }


@needs_browser
def test_browser_model_answer_latex_and_emphasis_render_like_the_sources_panel(browser, fake):
    """`95\\%` reads 95%, `$2\\times$` is math, \\textbf and ** are bold, * italic: while streaming
    and after."""
    page, _ = open_page(browser, fake.url)
    fake.gate.clear()
    try:
        send(page, "tex, please")
        bot = page.locator("#chat [data-testid=bot]").first
        page.wait_for_function(
            "() => { const b = document.querySelector('#chat [data-testid=bot]');"
            " return b && b.innerText.includes('stays text'); }",
            timeout=DEADLINE_MS,
        )
        mid = rendered(bot)  # the streamed text, before its last piece
    finally:
        fake.gate.set()
    assert CURSOR in mid["text"]
    final = rendered(wait_turn(page, 1))
    # a title in the references: as written
    assert "[1] A title with 95% and **stars**" in final["text"]
    for shown in (mid, final):
        text = shown["text"].split("References")[0]
        assert (
            "95%" in text
            and "95\\%" not in text
            and "\\textbf" not in text
            and "\\times" not in text
        ), text
        assert "**" not in text and "*fast*" not in text and "<b>x</b> stays text" in text, text
        assert (
            shown["math"] == 1
            and {"bold claim", "Palimpsa"} <= set(shown["strong"])
            and shown["em"] == ["fast"]
        )
    # the sources panel draws the same passage the same way; a title stays as written
    card = page.locator("#sources .src-card").first
    assert "95%" in card.inner_text() and card.locator(".src-passage math").count() == 1
    assert "**stars**" in card.locator(".src-title").inner_text()
    assert page.locator("#chat b, #chat img, #chat script").count() == 0
    page.close()


@needs_browser
def test_browser_shows_the_papers_found_while_the_model_reads(browser, fake):
    """The Sources panel lists the papers found as soon as retrieval is done, before the model has
    written a word; the answer then replaces the note, and the panel shows what it cites."""
    page, _ = open_page(browser, fake.url)
    fake.gate.clear()
    try:
        send(page, "reading, please")
        page.wait_for_function(
            "() => { const p = document.querySelector('#sources .src-panel');"
            " return p && p.innerText.includes('Papers found (2)'); }",
            timeout=DEADLINE_MS,
        )
        panel = page.locator("#sources .src-panel").inner_text()
        bot = page.locator("#chat [data-testid=bot]").first.inner_text()
    finally:
        fake.gate.set()
    assert "Found first" in panel and "Found second" in panel
    assert "Reading the sources" in bot and "about 12 s" in bot and "says so" not in bot
    final = wait_turn(page, 1)
    assert "The first paper says so" in final.inner_text()
    assert "Cited papers (1)" in page.locator("#sources .src-panel").inner_text()
    page.close()


@needs_browser
def test_browser_retrieval_choice_is_in_words_and_the_engine_gets_its_mode_name(browser, fake):
    page, _ = open_page(browser, fake.url)
    mode = page.locator("#mode")
    assert not mode.is_visible()  # folded under "Options"
    page.locator("#options").get_by_text("Options:", exact=False).first.click()
    mode.wait_for(state="visible")
    for label, _ in MODE_CHOICES:
        assert mode.get_by_text(label, exact=True).is_visible(), label
    assert page.locator("#mode input[value='hybrid']").is_checked()
    assert not any(name in mode.inner_text() for name in ("bm25", "dense", "hybrid"))
    fusion = [page.get_by_text(label, exact=True) for label, _ in ADVANCED_MODE_CHOICES]
    assert not any(f.is_visible() for f in fusion)  # folded away
    ask(page, "which mode by default?")
    assert fake.modes["which mode by default?"] == "hybrid"
    mode.get_by_text("Keywords (exact terms)", exact=True).click()
    ask(page, "which mode for keywords?", turn=2)
    assert fake.modes["which mode for keywords?"] == "bm25"
    page.locator("#mode-advanced").get_by_text("Advanced", exact=False).first.click()
    fusion[0].wait_for(state="visible")
    assert fusion[1].is_visible()
    fusion[0].click()  # the fold's choice replaces the one above
    page.wait_for_function("!document.querySelector('#mode input:checked')")
    ask(page, "which mode for rank fusion?", turn=3)
    assert fake.modes["which mode for rank fusion?"] == "hybrid-rrf"
    mode.get_by_text("Meaning (semantic)", exact=True).click()
    page.wait_for_function("!document.querySelector('#mode-fusion input:checked')")
    ask(page, "which mode for meaning?", turn=4)
    assert fake.modes["which mode for meaning?"] == "dense"
    page.close()


@needs_browser
def test_browser_an_advanced_default_mode_is_selected_at_start(browser):
    port = free_port()
    rag = FakeRAG(port, "http://127.0.0.1:9/x")
    rag.settings.mode = "hybrid-convex"
    demo = launch(rag, block=False)
    try:
        page, _ = open_page(browser, f"http://127.0.0.1:{port}/")
        convex = page.locator("#mode-fusion input[value='hybrid-convex']")
        assert convex.is_checked() and convex.is_visible()  # the fold opens to show it
        assert page.locator("#mode input:checked").count() == 0
        ask(page, "an advanced default")
        assert rag.modes["an advanced default"] == "hybrid-convex"
        page.close()
    finally:
        demo.close()


@needs_browser
def test_browser_login_refuses_a_wrong_password(browser):
    port = free_port()
    demo = launch(FakeRAG(port, "http://127.0.0.1:9/x", auth="alice:s3cret-pw"), block=False)
    url = f"http://127.0.0.1:{port}/"
    try:
        with httpx.Client(trust_env=False) as client:  # the API refuses callers without the cookie
            assert client.get(url + "config").status_code == 401
        page, _ = open_page(browser, url, wait_for_chat=False)
        # The login form shows nothing for a 429 (too many tries): the page states the limit up
        # front.
        page.get_by_text("After 5 failed tries, wait 60 s before trying again.").wait_for()
        user, password = (
            page.locator("input[data-testid=textbox]"),
            page.locator("input[data-testid=password]"),
        )
        user.fill("alice")
        password.fill("wrong")
        page.get_by_role("button", name="Login").click()
        page.get_by_text(re.compile("incorrect credentials", re.I)).wait_for(timeout=DEADLINE_MS)
        assert page.locator("#question textarea").count() == 0
        user.fill("alice")  # the form is emptied after a refusal
        password.fill("s3cret-pw")
        page.get_by_role("button", name="Login").click()
        page.locator("#question textarea").wait_for(timeout=DEADLINE_MS)
        assert "asked=after login" in ask(page, "after login").inner_text()
        page.close()
    finally:
        demo.close()


# ---------------------------------------------------------------- browser: a real RAG, extractive


@pytest.fixture(scope="module")
def real_url(seed_store):
    from rag import RAG

    rag = RAG(store_dir=seed_store, llm="none")  # extractive, as with RAG_LLM=none
    assert rag.settings.llm_backend == "none"
    port = free_port()
    demo = launch(rag, host="127.0.0.1", port=port, block=False)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@needs_browser
def test_browser_answer_cites_palimpsa_paper_with_highlighted_evidence(browser, real_url):
    page, response = open_page(browser, real_url)
    assert response.headers["content-security-policy"] == CSP
    header = page.locator("#header").inner_text()
    assert re.search(r"\b76 papers indexed", header) and "No language model is set up" in header
    # Examples drawn from indexed titles (waited for: Gradio may render them after the header).
    page.get_by_text("What does the paper “").first.wait_for(timeout=DEADLINE_MS)
    bot = ask(page, QUESTION)
    assert "Quoted word for word from the abstracts" in bot.inner_text()
    assert re.search(r"\[\d+\]", bot.inner_text()), bot.inner_text()
    links = bot.locator("a.cite")
    assert links.count() >= 1
    assert all(
        re.match(r"#src-1-\d+$", links.nth(i).get_attribute("href") or "")
        for i in range(links.count())
    )
    # [n] shows that paper's card in the Sources panel (marked a moment), in the same tab.
    target = links.first.get_attribute("href")[1:]
    pages = len(page.context.pages)
    links.first.click()
    card = page.locator(f"#{target}")
    card.wait_for(state="visible", timeout=DEADLINE_MS)
    assert "src-flash" in (card.get_attribute("class") or "")
    assert len(page.context.pages) == pages and page.url.startswith(real_url)
    assert (
        "References" in bot.inner_text()
        and "Learning to Remember" in bot.locator("a.ref").first.inner_text()
    )
    panel = page.locator("#sources")
    cited = page.locator("#sources .src-card:not(.src-uncited)")
    assert cited.count() >= 1 and "Learning to Remember" in cited.first.inner_text()
    marks = cited.first.locator("mark.evidence")
    assert marks.count() >= 1 and "Mamba2" in " ".join(marks.all_inner_texts())
    assert page.locator("#sources .src-card.src-uncited").count() >= 1
    assert "Retrieved, not cited" in panel.inner_text()
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / "ui_answer.png"), full_page=True)
    assert_loopback_only(page, real_url)  # nothing left the machine
    page.close()


SIZES = [{"width": 1440, "height": 900}, {"width": 1280, "height": 720}]
# Each element's box in the viewport, and whether its text is cut (clipped or ellipsised).
BOXES = """sel => [...document.querySelectorAll(sel)].map(e => { const r = e.getBoundingClientRect();
    return {text: e.innerText, top: r.top, bottom: r.bottom, left: r.left, right: r.right, area: r.width * r.height,
            cut: e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1}; })"""


@needs_browser
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}x{s['height']}")
def test_browser_first_screen_shows_whole_examples_a_click_asks_and_sources_stay_on_screen(
    browser, real_url, size
):
    page, _ = open_page(browser, real_url)
    page.set_viewport_size(size)
    page.get_by_text("What does the paper “").first.wait_for(timeout=DEADLINE_MS)
    page.wait_for_timeout(300)  # layout settles after the resize
    examples = page.evaluate(BOXES, "#examples button.example-q")
    assert len(examples) == 3, examples
    for e in examples:  # on the first screen, whole
        assert 0 <= e["top"] and e["bottom"] <= size["height"] and e["right"] <= size["width"], (
            size,
            e,
        )
        assert not e["cut"] and e["text"].endswith("?"), e
    # The options weigh less: folded into one line below the examples, the mode choices hidden until
    # opened.
    options = page.evaluate(BOXES, "#options")[0]
    assert options["top"] >= max(e["bottom"] for e in examples) and options["area"] < sum(
        e["area"] for e in examples
    )
    assert (
        not page.locator("#mode").is_visible()
        and not page.get_by_label("Papers (k)").first.is_visible()
    )
    header = page.locator("#header").inner_text()
    assert "No language model is set up, so answers are sentences quoted word for word" in header, (
        header
    )
    # A click on an example asks it: the question is echoed, answered, and its sources shown.
    asked = examples[1]["text"]
    page.locator("#examples button.example-q").nth(1).click()
    bot = wait_turn(page, 1)
    assert page.locator("#chat [data-testid=user]").first.inner_text().strip() == asked
    assert "Quoted word for word from the abstracts" in bot.inner_text()
    assert page.locator("#sources .src-card").count() >= 1
    # Scrolled down, in the page and in the chat: the sources panel is still on screen, with its
    # cards.
    page.mouse.move(size["width"] * 0.3, size["height"] * 0.5)
    page.mouse.wheel(0, 3000)
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    page.wait_for_timeout(300)
    panel = page.evaluate(BOXES, "#sources")[0]
    card = page.evaluate(BOXES, "#sources .src-card")[0]
    visible = min(panel["bottom"], size["height"]) - max(panel["top"], 0)
    assert visible >= 0.5 * size["height"], (size, panel)
    assert card["top"] < size["height"] and card["bottom"] > 0, card
    page.screenshot(path=str(ARTIFACTS / f"ui_first_screen_{size['width']}.png"))
    page.close()


@needs_browser
def test_browser_earlier_answers_keep_their_own_sources(browser, real_url):
    page, _ = open_page(browser, real_url)
    first = ask(page, QUESTION, turn=1)
    first_refs = first.locator("a.ref").all_inner_texts()
    first_panel = page.locator("#sources .src-card").all_inner_texts()
    assert any("Learning to Remember" in t for t in first_refs)
    second = ask(page, "Which papers study backdoor attacks on language models?", turn=2)
    second_panel = page.locator("#sources .src-card").all_inner_texts()
    assert second_panel != first_panel and "Backdoor" in " ".join(
        second.locator("a.ref").all_inner_texts()
    )
    # Scroll back: the first answer still shows its own references, and its sources come back.
    first.scroll_into_view_if_needed()
    assert first.locator("a.ref").all_inner_texts() == first_refs
    show_turn(page, 1)
    assert page.locator("#sources .src-card").all_inner_texts() == first_panel
    assert page.locator("#sources .src-card").first.get_attribute("id") == "src-1-1"
    show_turn(page, 2)
    assert page.locator("#sources .src-card").all_inner_texts() == second_panel
    # [n] in the earlier answer brings its sources back, at that paper's card.
    cite = first.locator("a.cite").first
    card_id = (cite.get_attribute("href") or "#")[1:]
    cite.click()
    page.locator(f"#{card_id}").wait_for(state="visible", timeout=DEADLINE_MS)
    assert page.locator("#turn-pick input[value='1']").is_checked()
    show_turn(page, 2)
    first.click()  # clicking an earlier answer shows its sources too
    page.wait_for_function(
        "document.querySelector('#sources .src-panel').dataset.turn === '1'", timeout=DEADLINE_MS
    )
    assert page.locator("#sources .src-card").all_inner_texts() == first_panel
    assert page.locator("#turn-pick input[value='1']").is_checked()
    page.close()


@needs_browser
def test_browser_seed_abstract_math_is_math_in_the_answer_and_the_card(browser, real_url):
    page, _ = open_page(browser, real_url)
    bot = ask(page, "Are neurons faithful and stable atoms of large language models?")
    text = bot.inner_text()
    assert "neurons are faithful" in text and "$ R^2=1 $" not in text and "\\star" not in text, text
    # R^2=1, q*=0.5, q*=68.2, R^2=48.8, quoted from the abstract
    assert bot.locator("math").count() >= 4
    card = page.locator(
        "#sources .src-card", has_text="Towards Atoms of Large Language Models"
    ).first
    assert card.locator("math").count() >= 6 and "$" not in card.inner_text()
    assert card.locator("mark.evidence math").count() >= 4
    assert_loopback_only(page, real_url)
    page.close()


# ---------------------------------------------------------------- browser: a poisoned corpus record

POISON = {
    "id": "POISON0001",
    "title": "Gradient Tomography <script>window.__pwned=1</script><img src=http://evil.example/x>",
    "authors": ["Mallory <img src=http://evil.example/a onerror=window.__pwned=4>"],
    "url": "https://openreview.net/forum?id=POISON0001",
    "abstract": (
        "We propose gradient tomography, which estimates gradients of variational quantum circuits"
        " from few measurements <script>window.__pwned=2</script>. Gradient tomography reduces"
        " circuit evaluations tenfold ![x](http://evil.example/y.png) on benchmark circuits. See"
        " [click](http://evil.example) and <iframe src=http://evil.example/f></iframe> for details"
        " of gradient tomography."
    ),
}
# LaTeX that tries to become an element, a link, a style or a request, beside math that should
# render.
POISON_LATEX = {
    "id": "POISONTEX1",
    "title": (
        "Spectral Sketching in $\\mathcal{O}(n \\log n)$ $<img src=http://evil.example/t"
        " onerror=window.__pwned=5>$ \\url{http://evil.example/u}"
    ),
    "authors": ["Eve $\\href{javascript:window.__pwned=6}{x}$"],
    "url": "https://openreview.net/forum?id=POISONTEX1",
    "abstract": (
        "We propose spectral sketching, which approximates kernel matrices in $\\mathcal{O}(n \\log"
        " n)$ time with error $\\epsilon$ and fit $ R^2=1 $. Spectral sketching is evaluated on"
        " \\href{javascript:window.__pwned=7}{benchmarks} listed at \\url{http://evil.example/v}"
        " and $\\href{javascript:window.__pwned=8}{x}$ in spectral sketching. Spectral sketching"
        " costs $5 and $10 per run $\\style{background:url(http://evil.example/s.png)}{y}$"
        " $\\text{<img src=http://evil.example/i onerror=window.__pwned=9>}$ with spectral"
        " sketching."
    ),
}
BENIGN = [
    {
        "id": "BENIGN0001",
        "title": "Sparse Mixture Routing",
        "authors": ["Ada Lovelace"],
        "url": "https://openreview.net/forum?id=BENIGN0001",
        "abstract": (
            "We propose SMR, a routing method for sparse mixtures of experts that balances load"
            " across experts without auxiliary losses."
        ),
    },
    {
        "id": "BENIGN0002",
        "title": "Protein Folding with Diffusion",
        "authors": ["Alan Turing"],
        "url": "https://openreview.net/forum?id=BENIGN0002",
        "abstract": (
            "A diffusion model predicts protein structures from sequences and improves accuracy on "
            "CASP benchmarks by 4 points."
        ),
    },
]


@pytest.fixture(scope="module")
def poisoned_url(tmp_path_factory):
    from rag import RAG

    tmp = tmp_path_factory.mktemp("poisoned")
    corpus = tmp / "poisoned.jsonl"
    corpus.write_text(
        "".join(json.dumps(r) + "\n" for r in [POISON, POISON_LATEX, *BENIGN]), encoding="utf-8"
    )
    rag = RAG(store_dir=tmp / "store", llm="none")
    assert rag.ingest([corpus], include_corpus=False).new_papers == 4
    port = free_port()
    demo = launch(rag, port=port, block=False)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@needs_browser
def test_browser_poisoned_record_is_shown_as_text_and_loads_nothing(browser, poisoned_url):
    page, response = open_page(browser, poisoned_url)
    assert response.headers["content-security-policy"] == CSP
    bot = ask(page, "How does gradient tomography estimate gradients of quantum circuits?")
    # Each of its sentences holds markup (a script, a remote image, a frame) that answers never
    # repeat (rag/answer/injection.py): none is quoted, and none of its payloads reaches the answer,
    # even as text. (The references may list another poisoned record's title: titles are shown
    # literally, as text.)
    for payload in ("__pwned=2", "evil.example/y.png", "evil.example/f", "[click]"):
        assert payload not in bot.inner_text(), payload
    card = page.locator("#sources .src-card", has_text="Gradient Tomography").first
    text = card.inner_text()
    assert POISON["title"] in text and "Mallory <img src=http://evil.example/a" in text
    for payload in (
        "<script>window.__pwned=2</script>",
        "![x](http://evil.example/y.png)",
        "[click](http://evil.example)",
        "<iframe src=http://evil.example/f></iframe>",
    ):
        assert payload in text, payload
    for where in ("#chat", "#sources", "#header", "#turn-pick"):
        assert page.locator(f"{where} img, {where} script, {where} iframe").count() == 0, where
    assert page.locator("a[href*='evil.example']").count() == 0
    nothing_ran_or_loaded(page, poisoned_url, "ui_poisoned.png")


@needs_browser
def test_browser_poisoned_latex_renders_its_math_and_nothing_else(browser, poisoned_url):
    page, _ = open_page(browser, poisoned_url)
    bot = ask(page, "How does spectral sketching approximate kernel matrices?")
    card = page.locator("#sources .src-card", has_text="Spectral Sketching").first
    # O(n log n), epsilon, R^2=1
    assert bot.locator("math").count() >= 2 and card.locator("math").count() >= 4
    text = card.locator(".src-title").inner_text() + card.locator(".src-passage").inner_text()
    assert "benchmarks" in text and "http://evil.example/v" in text  # a link's text; a URL as text
    # authors: as written
    assert "\\href" not in text and "\\url" not in text and "$\\href" in card.inner_text()
    # Gradio's icons are svg
    for where in ("#chat [data-testid=bot]", "#chat [data-testid=user]", "#sources"):
        assert (
            page.locator(
                f"{where} img, {where} script, {where} iframe, {where} svg, {where} style"
            ).count()
            == 0
        )
        assert page.locator(f"{where} a[href*='evil'], {where} a[href^='javascript']").count() == 0
    # every MathML attribute on the page is a layout one: no href, style, src or event handler
    names = page.evaluate(
        "() => [...new Set([...document.querySelectorAll('math, math *')]"
        ".flatMap(e => [...e.attributes].map(a => a.name)))]"
    )
    assert set(names) <= {
        "display",
        "stretchy",
        "fence",
        "form",
        "accent",
        "mathvariant",
        "width",
        "lspace",
        "rspace",
        "separator",
        "movablelimits",
        "largeop",
        "symmetric",
        "linethickness",
    }, names
    nothing_ran_or_loaded(page, poisoned_url, "ui_poisoned_latex.png")
