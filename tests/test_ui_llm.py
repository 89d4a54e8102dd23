"""The chat UI in a real browser with an LLM behind an OpenAI-compatible endpoint.

A model's wording is never asserted: the structure is (the answer streams in, the sources of each
turn are shown and stay attached to it, a follow-up carries the history, a failing LLM is reported
in the chat with the sources still shown). The streaming test runs the real llama.cpp server
(SmolLM2-135M): the chat's integration with a real model server. The follow-up and failure tests
watch what the chat does around a model, so they talk to tests/faultproxy.ModelStub instead (a fake:
a scripted OpenAI-compatible server on loopback, over the same HTTP client path), which answers in a
fraction of the tiny model's time.
"""

from __future__ import annotations

import contextlib

import pytest

from rag import RAG
from rag.ui.app import launch
from rag.ui.render import READING
from tests.faultproxy import ModelStub, fault_proxy
from tests.test_ui import (  # noqa: F401
    ARTIFACTS,
    CURSOR,
    QUESTION,
    ask,
    assert_loopback_only,
    free_port,
    needs_browser,
    open_page,
    show_turn,
)

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

FAST = {"llm_context_tokens": 400, "llm_max_tokens": 64}  # keep the tiny model quick on 2 cores
# What the stub streams, word by word: a short answer citing two sources.
STUB_TEXT = (
    "Palimpsa generalises Mamba2 with metaplastic forgetting [1]. Its experiments use long"
    " sequences [2]."
)


class SpyRAG(RAG):
    """A real RAG that records the history the UI passes with each question."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, list[dict] | None]] = []

    def stream(self, question, k=None, mode=None, llm=True, history=None):
        self.calls.append((question, [dict(t) for t in history] if history else None))
        return super().stream(question, k=k, mode=mode, llm=llm, history=history)


@contextlib.contextmanager
def _chat_on(seed_store, base_url: str, model: str):
    """The chat on a SpyRAG over the seeds whose model is the OpenAI-compatible server at
    `base_url`."""
    rag = SpyRAG(store_dir=seed_store, openai_base_url=base_url, llm_model=model, **FAST)
    assert rag.settings.llm_backend == "openai"
    port = free_port()
    demo = launch(rag, port=port, block=False)
    rag.url = f"http://127.0.0.1:{port}/"
    try:
        yield rag
    finally:
        demo.close()


@pytest.fixture(scope="module")
def llm_ui(seed_store, llama_server):
    with _chat_on(seed_store, llama_server.base_url, llama_server.model) as rag:
        yield rag


@pytest.fixture(scope="module")
def stub_ui(seed_store):
    """The chat on a real RAG over the seeds whose model is a ModelStub (see the module
    docstring)."""
    with (
        ModelStub(text=STUB_TEXT, tokens=len(STUB_TEXT.split(" ")), interval=0.01) as stub,
        _chat_on(seed_store, stub.base_url, stub.model) as rag,
    ):
        yield rag


WATCH_STREAM = """() => {
  window.__partials = [];
  const chat = document.querySelector('#chat');
  new MutationObserver(() => {
    const bots = chat.querySelectorAll('[data-testid=bot]');
    if (bots.length) window.__partials.push(bots[bots.length - 1].innerText);
  }).observe(chat, {subtree: true, childList: true, characterData: true});
}"""


@needs_browser
def test_browser_llm_answer_streams_in_with_its_sources(browser, llm_ui, llama_server):
    page, _ = open_page(browser, llm_ui.url)
    assert (
        f"Answers are written by {llama_server.model} (openai)."
        in page.locator("#header").inner_text()
    )
    page.evaluate(WATCH_STREAM)
    bot = ask(page, QUESTION)
    seen = page.evaluate("window.__partials")
    # While the model reads the sources, the message says so; then the text appears piece by piece.
    assert any(READING in t for t in seen), seen
    partials = {t.replace(CURSOR, "").strip() for t in seen if CURSOR in t and READING not in t}
    partials.discard("")
    assert len(partials) >= 2, partials
    final = bot.inner_text()
    assert CURSOR not in final and final.strip()
    cards = page.locator("#sources .src-card")
    assert cards.count() == 5 and "Learning to Remember" in page.locator("#sources").inner_text()
    cited = page.locator("#sources .src-card:not(.src-uncited)").count()
    assert bot.locator("a.ref").count() == cited  # the message lists exactly the papers it cites
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / "ui_answer_llm.png"), full_page=True)
    assert_loopback_only(page, llm_ui.url)
    page.close()


@needs_browser
def test_browser_follow_up_uses_history_and_earlier_turn_keeps_its_sources(browser, stub_ui):
    """On the stub: what is asserted is the history the UI passes and the sources each turn
    keeps."""
    page, _ = open_page(browser, stub_ui.url)
    first = ask(page, QUESTION, turn=1)
    first_text = first.inner_text()
    first_panel = page.locator("#sources .src-card").all_inner_texts()
    assert len(first_panel) == 5
    stub_ui.calls.clear()
    second = ask(page, "What about its experiments?", turn=2)
    # The second turn went to the library with the first turn as history.
    question, history = stub_ui.calls[-1]
    assert question == "What about its experiments?"
    assert [t["role"] for t in history] == ["user", "assistant"] and history[0][
        "content"
    ] == QUESTION
    assert second.inner_text().strip() and page.locator("#sources .src-card").count() == 5
    assert "Sources for answer 2" in page.locator("#sources").inner_text()
    # Scrolling back: the first answer is unchanged and its own sources come back.
    first.scroll_into_view_if_needed()
    assert first.inner_text() == first_text
    show_turn(page, 1)
    assert page.locator("#sources .src-card").all_inner_texts() == first_panel
    assert "Sources for answer 1" in page.locator("#sources").inner_text()
    page.close()


@needs_browser
def test_browser_llm_failure_is_shown_in_the_chat_and_sources_still_appear(browser, seed_store):
    """The fault proxy answers every completion with 503, so no model ever answers: its upstream is
    the stub."""
    with ModelStub() as stub, fault_proxy(stub.url) as proxy:
        proxy.fail(503, times=None)
        rag = RAG(
            store_dir=seed_store,
            openai_base_url=proxy.url + "/v1",
            llm_model=stub.model,
            llm_retries=0,
            llm_timeout=10,
            **FAST,
        )
        port = free_port()
        demo = launch(rag, port=port, block=False)
        try:
            page, _ = open_page(browser, f"http://127.0.0.1:{port}/")
            bot = ask(page, QUESTION)
            text = bot.inner_text()
            first_line = text.strip().splitlines()[0]
            assert first_line.startswith("⚠️ LLM failed:") and "503" in first_line, text
            assert "quoted word for word from the abstracts instead" in text  # the fallback follows
            assert bot.locator("a.cite").count() >= 1 and bot.locator("a.ref").count() >= 1
            assert page.locator("#sources .src-card").count() == 5
            assert page.locator("#sources .src-card:not(.src-uncited)").count() >= 1
            assert proxy.count() >= 1
            page.close()
        finally:
            demo.close()
