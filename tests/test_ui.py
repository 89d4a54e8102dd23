"""The chat UI: rendering is escaped, and a real browser gets a streamed, cited answer.

Browser tests drive Debian's /usr/bin/chromium with Playwright (never `playwright install`); they are
skipped, with the reason, only where chromium or playwright is missing and CI is not set.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rag.errors import InputError
from rag.models import Answer, Source
from ui.app import CSP, header_text, launch, md_text, render_answer, render_sources

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent / "artifacts"
QUESTION = "How does Palimpsa relate to Mamba2?"
HOSTILE_TITLE = "Learning <script>window.pwned=1</script> & Forgetting"
HOSTILE_PASSAGE = 'We propose <img src="{evil}" onerror="window.pwned=2"> Palimpsa <b>bold</b>'

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - reported by the skip below
    sync_playwright = None

_missing = [what for what, ok in (("/usr/bin/chromium", os.path.exists(CHROMIUM)),
                                  ("the playwright package", sync_playwright is not None)) if not ok]
needs_browser = pytest.mark.skipif(
    bool(_missing) and not os.environ.get("CI"),
    reason=f"browser test needs {' and '.join(_missing)} (apt-get install -y chromium; pip install playwright)",
)


class FakeRAG:
    """Stands in for RAG where the test needs hostile corpus text; echoes the history length."""

    def __init__(self, port: int, evil_url: str) -> None:
        self.settings = SimpleNamespace(llm_backend="none", llm_model="-", top_k=5, mode="hybrid",
                                        ui_host="127.0.0.1", ui_port=port)
        self.evil_url = evil_url

    def stats(self) -> dict:
        return {"papers": 3, "chunks": 3}

    def stream(self, question, k=5, mode="hybrid", llm=True, history=None):
        if question == "boom":
            raise InputError("question <b>rejected</b>; rephrase it")
        text = (f"Palimpsa <b>generalises</b> Mamba2 [1] ![pixel]({self.evil_url}) [2]. "
                f"turns={len(history or [])}")
        for word in text.split(" "):
            yield word + " "
        yield Answer(question=question, answer=text, mode="extractive", sources=[
            Source(n=1, paper_id="p1", title=HOSTILE_TITLE, authors=["A <i>B</i>"],
                   url="https://openreview.net/forum?id=p1", score=0.9,
                   passage=HOSTILE_PASSAGE.format(evil=self.evil_url), cited=True),
            Source(n=2, paper_id="p2", title="Second", url=None, score=0.5, passage="x", cited=True),
            Source(n=3, paper_id="p3", title="Uncited", url="javascript:alert(1)", score=0.1,
                   passage="y", cited=False)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- rendering, no browser

def test_model_text_cannot_inject_markup_images_or_links():
    out = md_text('<img src=x onerror=alert(1)> ![i](http://e.com/i.png) [a](http://e.com) `c` $x$')
    assert "<img" not in out and "&lt;img" in out
    assert "![" not in out and "](" not in out.replace("\\](", "") and "\\`" in out and "\\$" in out


def test_markers_link_to_paper_or_card_and_unknown_ones_stay_text():
    srcs = [Source(n=1, paper_id="a", title='T "q"', url="https://openreview.net/forum?id=a", score=1,
                   passage="", cited=True),
            Source(n=2, paper_id="b", title="U", url="javascript:alert(1)", score=1, passage="", cited=True)]
    out = render_answer("A [1]. B [2]. C [1, 2]. D [9].", srcs)
    assert out.count('href="https://openreview.net/forum?id=a"') == 2
    assert out.count('href="#src-2"') == 2 and "javascript" not in out
    assert "\\[9\\]" in out and 'title="T &quot;q&quot;"' in out


def test_sources_panel_escapes_and_splits_cited_from_uncited():
    fake = FakeRAG(0, "http://127.0.0.1:9/evil.png")
    answer = list(fake.stream("q"))[-1]
    out = render_sources(answer.sources)
    assert "<script>" not in out and "&lt;script&gt;" in out and "<img" not in out
    assert out.index("Cited papers (2)") < out.index("Retrieved, not cited (1)") < out.index("Uncited")
    assert "javascript:" not in out
    assert "appear here" in render_sources([])


def test_header_names_corpus_size_and_model():
    fake = FakeRAG(0, "")
    assert "extractive: no LLM configured" in header_text(fake) and "**3**" in header_text(fake)
    fake.settings.llm_backend, fake.settings.llm_model = "openai", "gpt-4o-mini"
    assert "openai: gpt-4o-mini" in header_text(fake)


# ---------------------------------------------------------------- servers and browser

@pytest.fixture(scope="module")
def browser():
    if sync_playwright is None:
        pytest.fail("playwright is not installed (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-background-networking", "--disable-component-update"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def fake_url():
    """A FakeRAG served by `launch` with host and port taken from its settings."""
    port = free_port()
    demo = launch(FakeRAG(port, f"http://127.0.0.1:{free_port()}/evil.png"), block=False)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def store_dir(request, tmp_path_factory):
    try:
        return request.getfixturevalue("seed_store")
    except pytest.FixtureLookupError:
        from rag import RAG
        path = tmp_path_factory.mktemp("ui_store")
        RAG(store_dir=path, llm="none").ingest()
        return path


@pytest.fixture(scope="module")
def real_url(store_dir):
    from rag import RAG
    rag = RAG(store_dir=store_dir, llm="none")  # extractive, as with RAG_LLM=none
    assert rag.settings.llm_backend == "none"
    port = free_port()
    demo = launch(rag, host="127.0.0.1", port=port, block=False)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.requests = []
    page.on("request", lambda r: page.requests.append(r.url))
    response = page.goto(url)
    page.locator("#question textarea").wait_for(timeout=30_000)
    return page, response


def ask(page, question, n_answers=1):
    box = page.locator("#question textarea")
    box.fill(question)
    box.press("Enter")
    page.locator("#sources .src-card").first.wait_for(timeout=120_000)
    bots = page.locator("#chat [data-testid=bot]")
    page.wait_for_function(  # the streaming cursor is gone: the final Answer was rendered
        "n => { const b = document.querySelectorAll('#chat [data-testid=bot]');"
        " return b.length >= n && !b[b.length - 1].innerText.includes('\u258c'); }",
        arg=n_answers, timeout=120_000)
    return bots.last


@needs_browser
def test_browser_answer_cites_palimpsa_paper(browser, real_url):
    page, response = open_page(browser, real_url)
    assert response.headers["content-security-policy"] == CSP
    header = page.locator("#header").inner_text()
    assert re.search(r"\b\d+ papers indexed", header) and "extractive: no LLM configured" in header
    bot = ask(page, QUESTION)
    assert re.search(r"\[\d+\]", bot.inner_text()), bot.inner_text()
    links = bot.locator("a.cite")
    assert links.count() >= 1
    assert all(re.match(r"(https?://|#src-\d+$)", links.nth(i).get_attribute("href") or "")
               for i in range(links.count()))
    panel = page.locator("#sources")
    assert "Learning to Remember" in panel.inner_text()
    assert page.locator("#sources .src-card:not(.src-uncited)").count() >= 1
    page.wait_for_timeout(300)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui_answer.png"), full_page=True)
    assert [u for u in page.requests if not u.startswith(real_url)] == []  # nothing left the machine
    page.close()


@needs_browser
def test_browser_shows_hostile_corpus_text_as_text(browser, fake_url):
    page, response = open_page(browser, fake_url)
    assert "default-src 'self'" in response.headers["content-security-policy"]
    bot = ask(page, "anything")
    assert "<b>generalises</b>" in bot.inner_text() and "![pixel](" in bot.inner_text()
    panel = page.locator("#sources")
    assert HOSTILE_TITLE in panel.inner_text() and "<img src=" in panel.inner_text()
    assert page.locator("#chat img, #sources img, #sources script, #sources b").count() == 0
    assert page.evaluate("window.pwned") is None
    assert not [u for u in page.requests if "evil.png" in u]
    assert ask(page, "boom", n_answers=2).inner_text().strip() == "⚠️ question <b>rejected</b>; rephrase it"
    page.close()


@needs_browser
def test_browser_sessions_keep_their_own_history(browser, fake_url):
    one, _ = open_page(browser, fake_url)
    two, _ = open_page(browser, fake_url)
    ask(one, "first")
    assert "turns=2" in ask(one, "follow-up", n_answers=2).inner_text()  # one's history reached rag
    assert "turns=0" in ask(two, "fresh").inner_text()  # two never saw one's turns
    one.locator("#clear").click()
    one.wait_for_function("!document.querySelector('#chat [data-testid=bot]')", timeout=10_000)
    assert "turns=0" in ask(one, "after clear").inner_text()
    assert two.locator("#chat [data-testid=bot]").count() == 1
    one.close(), two.close()
