"""The chat UI's hardening: closed routes, a throttled login, headers on every response, what the
page shows.

Route-level checks send real HTTP requests to the running app; page-level checks drive Debian's
/usr/bin/chromium with Playwright (fixtures from tests/test_ui.py). Every test here failed before
the fix it covers (see the README's bad-input table).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rag.ui.app import launch
from rag.ui.render import UI_ABSTAIN
from rag.ui.security import LoginThrottle
from tests.servers import free_port
from tests.test_ui import (  # noqa: F401
    CSP,
    CURSOR,
    DEADLINE_MS,
    FakeRAG,
    ask,
    fake,
    needs_browser,
    open_page,
    real_url,
    send,
    wait_turn,
)

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

AUTH = ("alice", "s3cret-pw")


@contextlib.contextmanager
def serve(**kwargs):
    """A FakeRAG app on a free loopback port; yields (demo, base url without the trailing slash)."""
    port = free_port()
    auth = kwargs.pop("auth", None)
    demo = launch(FakeRAG(port, "http://127.0.0.1:9/x", auth=auth), block=False, **kwargs)
    try:
        yield demo, f"http://127.0.0.1:{port}"
    finally:
        demo.close()


def client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=DEADLINE_MS / 1000)


def status_of(c: httpx.Client, method: str, url: str, **kw) -> int:
    """The status alone; a stream is opened and closed at once (an open heartbeat never ends)."""
    with c.stream(method, url, **kw) as r:
        assert "default-src 'self'" in r.headers.get("content-security-policy", ""), (method, url)
        return r.status_code


# ---------------------------------------------------------------- routes


def test_uploads_are_refused_and_nothing_lands_on_disk(fake):
    name = f"probe-{uuid.uuid4().hex}.bin"
    with client() as c:
        r = c.post(fake.url + "gradio_api/upload", files={"files": (name, b"x" * 200_000)})
        assert 400 <= r.status_code < 500, r.text
        assert r.headers["content-security-policy"] == CSP
    upload_dir = Path(fake.demo.app.uploaded_file_dir)
    assert not list(upload_dir.rglob(name)), f"{name} was stored under {upload_dir}"


def test_routes_the_page_does_not_use_are_closed(fake):
    with client() as c:
        for method, path in (
            ("GET", "openapi.json"),
            ("GET", "docs"),
            ("GET", "gradio_api/openapi.json"),
            ("POST", "gradio_api/reset"),
            ("GET", "gradio_api/token"),
            ("POST", "gradio_api/cancel"),
            ("GET", "gradio_api/dev/reload"),
            ("POST", "gradio_api/vibe-code"),
            ("GET", "gradio_api/upload_progress"),
        ):
            assert status_of(c, method, fake.url + path, json={}) == 404, path
        # What the page and gradio_client use stays open (the heartbeat frees a closed tab's state).
        assert status_of(c, "GET", fake.url) == 200
        assert status_of(c, "GET", fake.url + "config") == 200
        assert status_of(c, "GET", fake.url + "gradio_api/info") == 200
        assert status_of(c, "GET", fake.url + "gradio_api/heartbeat/abc") == 200


def test_with_a_login_nothing_but_the_login_page_answers_a_stranger():
    with serve(auth=":".join(AUTH)) as (_, url), client() as c:
        for method, path in (
            ("GET", "/openapi.json"),
            ("POST", "/gradio_api/reset"),
            ("GET", "/gradio_api/heartbeat/abc"),
            ("GET", "/gradio_api/user"),
            ("GET", "/gradio_api/app_id"),
        ):
            assert status_of(c, method, url + path, json={}) == 404, path
        assert status_of(c, "GET", url + "/config") == 401  # Gradio's own check, kept
        assert (
            c.post(url + "/login", data=dict(zip(("username", "password"), AUTH))).status_code
            == 200
        )
        assert status_of(c, "GET", url + "/gradio_api/heartbeat/abc") == 200  # logged in: open


def test_unknown_api_names_are_404_and_every_error_carries_the_csp(fake):
    with client() as c:
        for path in (
            "gradio_api/call/nonexistent",
            "gradio_api/run/nonexistent",
            "gradio_api/api/nonexistent",
            "gradio_api/call/v2/nonexistent",
        ):
            r = c.post(fake.url + path, json={"data": []})
            assert r.status_code == 404 and "nonexistent" in r.json()["detail"], (
                path,
                r.status_code,
                r.text,
            )
            assert r.headers["content-security-policy"] == CSP, path
        # Gradio: a stream cut off mid-way
        r = c.get(fake.url + "gradio_api/call/nonexistent/some-event")
        assert r.status_code == 404 and r.headers["content-security-policy"] == CSP
        # An error no route handles (an unknown function index) is a 500, with the headers all the
        # same.
        r = c.post(fake.url + "gradio_api/run/predict", json={"data": [], "fn_index": 999})
        assert r.status_code == 500 and r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff" and "Traceback" not in r.text
        # The API names the app defines still answer.
        r = c.post(fake.url + "gradio_api/call/respond", json={"data": ["hello", [], 3, "hybrid"]})
        assert r.status_code == 200 and r.json()["event_id"]


def test_parallel_wrong_passwords_are_capped_per_client_and_the_right_one_works_after_the_window():
    throttle = LoginThrottle(attempts=3, window=4.0)
    with serve(auth=":".join(AUTH), login_throttle=throttle) as (_, url), client() as c:

        def attempt(password: str) -> httpx.Response:
            return c.post(url + "/login", data={"username": AUTH[0], "password": password})

        # before the first counted attempt: its window ends after started + window
        started = time.monotonic()
        with ThreadPoolExecutor(20) as pool:
            codes = [r.status_code for r in pool.map(attempt, [f"wrong{i}" for i in range(20)])]
        assert codes.count(400) <= 3 and codes.count(429) >= 17 and set(codes) <= {400, 429}, codes
        locked = attempt(AUTH[1])  # locked out: even the right password waits for the window
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
        assert locked.json()["detail"].startswith("Too many login attempts; try again in")
        # Wait out the window from its earliest possible start, then retry briefly (a refused try is
        # not counted) for the moment the first attempt was counted after `started`.
        time.sleep(max(0.0, started + throttle.window - time.monotonic()))
        while (
            after := attempt(AUTH[1])
        ).status_code == 429 and time.monotonic() < started + 2 * throttle.window:
            time.sleep(0.05)
        assert after.status_code == 200
        assert attempt("wrong again").status_code == 400  # a success starts the count afresh


# ---------------------------------------------------------------- the page


@needs_browser
def test_browser_page_works_under_the_tightened_csp(browser, fake):
    page, response = open_page(browser, fake.url)
    assert response.headers["content-security-policy"] == CSP
    assert (
        "frame-ancestors 'self'" in CSP
        and "frame-src 'self'" in CSP
        and "blob:" not in CSP
        and "media-src 'none'" in CSP
    )
    console = []
    page.on("console", lambda m: console.append(m.text))
    failed = []
    page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
    bot = ask(page, "anything at all")
    assert "asked=anything at all" in bot.inner_text()
    # gr.HTML renders (it needs 'unsafe-eval')
    assert page.locator("#sources .src-card").count() == 3
    assert "Error rendering HTML" not in page.locator("#sources").inner_text()
    assert [t for t in console if "Content Security Policy" in t] == [], console
    assert failed == []  # the closed routes are none the page asks for
    page.close()


@needs_browser
def test_browser_titles_show_markdown_literally_and_long_titles_wrap(browser, fake):
    page, _ = open_page(browser, fake.url)
    emphasis = "*Bold* _claims_ **x** ~~gone~~"
    # FakeRAG titles its second source "Second, for <question>"
    question = f"{emphasis} {'W' * 300}"
    bot = ask(page, question)
    # what the user typed: as typed
    assert emphasis in page.locator("#chat [data-testid=user]").inner_text()
    # The answer (model text) draws * and ** emphasis as the sources panel does; nothing else
    # becomes markup.
    assert "Bold _claims_ x ~~gone~~" in bot.inner_text() and bot.locator("del").count() == 0
    assert bot.locator("em").all_inner_texts() == ["Bold"]
    assert [t for t in bot.locator("strong").all_inner_texts() if t != "References"] == ["x"]
    card = page.locator("#sources .src-card", has_text="Second, for").first
    assert f"Second, for {question}" in card.inner_text()
    widths = page.evaluate("""() => [...document.querySelectorAll(
        '#sources .src-card, #chat [data-testid=bot], #chat [data-testid=user]')].map(
        e => [e.scrollWidth, e.clientWidth])""")
    assert len(widths) == 5 and all(s <= c for s, c in widths), widths
    page.close()


@needs_browser
def test_browser_latex_in_model_output_and_titles_makes_no_element_link_or_request(browser, fake):
    page, _ = open_page(browser, fake.url)
    # FakeRAG: hostile LaTeX in the answer, a title and a passage
    bot = ask(page, "math with poison")
    page.wait_for_timeout(500)
    assert bot.locator("math").count() >= 4 and page.locator("#sources math").count() >= 4
    # Gradio's icons are svg
    for where in ("#chat [data-testid=bot]", "#chat [data-testid=user]", "#sources"):
        assert (
            page.locator(f"{where} img, {where} script, {where} iframe, {where} svg").count() == 0
        ), where
        assert (
            page.locator(f"{where} a[href^='javascript'], {where} a[href*='evil']").count() == 0
        ), where
        assert (
            page.locator(f"{where} math [href], {where} math [style], {where} math [src]").count()
            == 0
        ), where
    # \\href and \\url give text, not links
    assert bot.locator("a:not(.cite):not(.ref)").count() == 0
    assert "click" in bot.inner_text() and "evil.png?u" in bot.inner_text()
    assert page.evaluate("window.pwned") is None
    assert not [u for u in page.requests if "evil" in u]
    page.close()


@needs_browser
def test_browser_abstention_says_where_the_nearest_papers_are(browser, real_url):
    page, _ = open_page(browser, real_url)
    bot = ask(page, "What is the best recipe for sourdough bread?")
    text = bot.inner_text()
    assert UI_ABSTAIN in text and "below" not in text, text
    assert page.locator("#sources .src-card.src-uncited").count() >= 1  # and there they are
    page.close()


@needs_browser
def test_browser_question_sent_while_an_answer_streams_is_answered_after(browser, fake):
    page, _ = open_page(browser, fake.url)
    fake.gate.clear()
    try:
        send(page, "gated first")
        page.wait_for_function(
            "c => document.querySelector('#chat [data-testid=bot]')?.innerText.includes(c)",
            arg=CURSOR,
        )  # streaming, held after its first word
        send(page, "second question")
        page.wait_for_timeout(500)
        # kept, not dropped
        assert page.locator("#question textarea").input_value() == "second question"
    finally:
        fake.gate.set()
    # The second answer follows the first at once: the panel may never show turn 1 when looked at.
    assert "asked=second question turns=2" in wait_turn(page, 2).inner_text()
    assert "asked=gated first" in page.locator("#chat [data-testid=bot]").nth(0).inner_text()
    assert page.locator("#question textarea").input_value() == ""
    page.close()


# ---------------------------------------------------------------- `rag ui`


def test_rag_ui_log_has_no_share_hint(seed_store, tmp_path):
    port = free_port()
    exe = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    log = tmp_path / "ui.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [exe, "ui", "--port", str(port), "--store", str(seed_store)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + DEADLINE_MS / 1000
        with client() as c:
            while True:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"rag ui did not start:\n{log.read_text()}"
                with contextlib.suppress(httpx.TransportError):
                    if c.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                        break
                time.sleep(0.1)
        # Our line comes after Gradio's launch; give a banner that would follow it a moment too.
        while "Paper chat on" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        text = log.read_text()
        assert f"Paper chat on http://127.0.0.1:{port}/" in text and "share=True" not in text, text
    finally:
        proc.terminate()
        proc.wait(timeout=20)
