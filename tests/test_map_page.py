"""The map page (rag/paper_map/page.py) in a real headless Chromium: drawing, hover, cards, search,
highlight, embedding.

The data is synthetic (three gaussian blobs of made-up papers, plus a few placed by hand) because
these tests are of the page alone, not of how a corpus gets laid out or clustered. Browser tests
drive Debian's /usr/bin/chromium with Playwright (never `playwright install`; the session's
`browser` fixture, tests/browser.py); they are skipped, with the reason, only where chromium or
playwright is missing and CI is not set. WebGL runs on SwiftShader, Chromium's software renderer.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import math
import random
import re
import threading
import time
from importlib import resources

import pytest

from rag.paper_map.page import render_map_html
from tests.browser import needs_browser

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

DEADLINE_MS = 120_000  # a busy 2-core machine; a pass is much faster
BG = (247, 247, 249)  # the page's background colour (--bg)
CITED = (255, 208, 0)  # the fill of a cited paper's marker

HOSTILE = (
    'Poisoned </script><script>window.pwned=2</script> and <img src=x onerror="window.pwned=1">'
    " $R^2=1$"
)
HOSTILE_LABEL = '<img src=x onerror="window.pwned=3"> labels'
HOSTILE_QUESTION = '</script><img src=x onerror="window.pwned=5"> Which "papers" & why?'
RTL_TITLE = (
    "\u05dc\u05de\u05d9\u05d3\u05d4 \u05e2\u05de\u05d5\u05e7\u05d4 \U0001f9e0 \u2028 deep learning"
)
LONG_WORD = "x" * 300
# Papers placed by hand away from the blobs (and from the page's panels), so that the point under
# the mouse is theirs alone.
PLACED = {
    "target": ("Sparse Attention for Long Documents", 0.9, -0.3, 1),
    "evil": (HOSTILE, -0.9, -0.3, 3),
    "rtl": (RTL_TITLE, 0.1, 0.1, -1),
    "long": (LONG_WORD, 0.35, -0.1, 0),
}
BLOBS = [(-0.6, 0.5, "Diffusion"), (0.55, 0.45, "Graph"), (0.0, -0.55, "Policy")]


def synthetic(per_blob=150, seed=7, **extra) -> dict:
    """Three gaussian blobs of made-up papers (cluster k = blob k) plus the PLACED ones."""
    rng = random.Random(seed)
    cols: dict[str, list] = {
        k: []
        for k in (
            "ids",
            "titles",
            "authors",
            "years",
            "venues",
            "urls",
            "abstracts",
            "x",
            "y",
            "cluster",
        )
    }

    def add(pid, title, x, y, cluster, author, url):
        for key, value in zip(
            cols,
            (pid, title, author, "2024", "ICLR 2024", url, f"Abstract of {pid}.", x, y, cluster),
        ):
            cols[key].append(value)

    for k, (cx, cy, word) in enumerate(BLOBS):
        for j in range(per_blob):
            add(
                f"{word.lower()}-{j}",
                f"{word} model number {j}",
                rng.gauss(cx, 0.1),
                rng.gauss(cy, 0.1),
                k,
                f"Author {j % 17}, Coauthor {k}",
                f"https://openreview.net/forum?id={word}{j}",
            )
    for pid, (title, x, y, cluster) in PLACED.items():
        url = "javascript:window.pwned=4" if pid == "evil" else "https://example.org/target"
        add(
            pid,
            title,
            x,
            y,
            cluster,
            "Ada Lovelace, Alan Turing" if pid == "target" else "Eve",
            url,
        )
    labels = [
        "diffusion · score · denoising",
        "graph · message passing",
        "policy · reward · agents",
    ]
    labels.append(HOSTILE_LABEL)
    clusters = [
        {"label": label, "x": x, "y": y, "size": per_blob}
        for label, (x, y, _) in zip(labels, BLOBS + [(-0.9, -0.45, "")])
    ]
    clusters[3]["size"] = 1
    return {"title": "Map of synthetic papers", "papers": cols, "clusters": clusters, **extra}


# ---------------------------------------------------------------- the document itself (no browser)


def test_data_is_inert_json_and_compact():
    data = synthetic(
        per_blob=20, highlight={"cited": ["target"], "retrieved": []}, question=HOSTILE_QUESTION
    )
    data["papers"]["x"][0] = 0.123456789
    page = render_map_html(data)
    # Only the page's own two script elements: nothing from the data opens or closes one.
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<img" not in page and "\u2028" not in page
    assert "default-src 'none'" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing remote referenced
    blob = re.search(
        r'<script type="application/json" id="map-data">(.*?)</script>', page, re.S
    ).group(1)
    payload = json.loads(blob)
    assert (
        payload["papers"]["titles"][-3] == HOSTILE and payload["papers"]["titles"][-2] == RTL_TITLE
    )
    assert payload["papers"]["x"][0] == 0.1235
    assert payload["question"] == HOSTILE_QUESTION and payload["highlight"] == {
        "cited": ["target"],
        "retrieved": [],
    }
    assert "<title>Map of synthetic papers</title>" in page


def test_mismatched_columns_are_refused():
    data = synthetic(per_blob=5)
    data["papers"]["y"].pop()
    with pytest.raises(ValueError, match="'y'"):
        render_map_html(data)


def test_big_map_stays_compact():
    n = 100_000
    rng = random.Random(1)
    papers = {
        "ids": [f"p{i}" for i in range(n)],
        "titles": [f"Paper {i} on topic {i % 97}" for i in range(n)],
        "authors": ["A. Author, B. Author"] * n,
        "years": ["2025"] * n,
        "venues": ["NeurIPS"] * n,
        "urls": [""] * n,
        "abstracts": None,
        "x": [rng.uniform(-1, 1) for _ in range(n)],
        "y": [rng.uniform(-1, 1) for _ in range(n)],
        "cluster": [i % 50 for i in range(n)],
    }
    page = render_map_html({"title": "Big", "papers": papers, "clusters": []})
    text = json.dumps(
        {k: papers[k] for k in ("ids", "titles", "authors", "years", "venues", "urls")},
        separators=(",", ":"),
    )
    assert len(page.encode()) < len(text) + 25 * n  # x, y and cluster: 25 bytes a paper at most


def csp_of(page: str) -> dict[str, str]:
    """The page's Content-Security-Policy <meta>, as {directive: its sources}."""
    policy = re.search(r'http-equiv="Content-Security-Policy"\s+content="([^"]*)"', page).group(1)
    return dict(d.strip().partition(" ")[::2] for d in policy.split(";"))


def sha256_source(text: str) -> str:
    return (
        "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"
    )


def test_the_csp_pins_the_pages_own_script_and_style_by_hash():
    page = render_map_html(
        synthetic(per_blob=5, highlight={"cited": ["target"], "retrieved": []}, question="q")
    )
    csp = csp_of(page)
    assert "unsafe" not in " ".join(csp.values()), csp
    assert csp["default-src"] == "'none'" and csp["img-src"] == "data:"
    # The hashes are of the elements' text as served, and that text is the static files' (nothing
    # else inlined).
    style = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
    assert csp["style-src"] == sha256_source(style) and csp["script-src"] == sha256_source(script)
    static = resources.files("rag.paper_map") / "static"
    assert style.strip() == (static / "map.css").read_text(encoding="utf-8").strip()
    assert script.strip() == (static / "map.js").read_text(encoding="utf-8").strip()
    # Another map (other data, title, question) has the same policy: the data block is never
    # executed.
    other = render_map_html(synthetic(per_blob=3, seed=1, title="Other <title>"))
    assert csp_of(other) == csp


# ---------------------------------------------------------------- browser helpers


def open_map(
    browser, data, tmp_path, init_script=None, name="map.html", html=None, **context_options
):
    """The map page (of `data`, or the given `html`) from a file:// URL in its own context; requests
    and page errors (CSP violations among them: Chromium reports each on the console) recorded."""
    options = {"viewport": {"width": 1280, "height": 800}, **context_options}
    context = browser.new_context(**options)
    context.set_default_timeout(DEADLINE_MS)
    if init_script:
        context.add_init_script(init_script)
    page = context.new_page()
    page.requests, page.errors = [], []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("close", lambda _: context.close())
    path = tmp_path / name
    path.write_text(render_map_html(data) if html is None else html, encoding="utf-8")
    page.url_of_map = path.as_uri()
    page.goto(page.url_of_map)
    page.wait_for_function("window.ragMap && window.ragMap.ready")
    return page


def canvas_stats(page):
    """Pixels of the canvas that are not background, and how many distinct colours it holds."""
    return page.evaluate(
        """bg => {
        const c = document.getElementById('map'), t = document.createElement('canvas');
        t.width = c.width; t.height = c.height;
        const g = t.getContext('2d'); g.drawImage(c, 0, 0);
        const d = g.getImageData(0, 0, t.width, t.height).data, colours = new Set();
        let painted = 0;
        for (let k = 0; k < d.length; k += 4) {
            if (d[k] !== bg[0] || d[k + 1] !== bg[1] || d[k + 2] !== bg[2]) painted++;
            colours.add((d[k] << 16) | (d[k + 1] << 8) | d[k + 2]);
        }
        return {painted, colours: colours.size, width: t.width};
    }""",
        list(BG),
    )


def pixel(page, x, y):
    """The canvas colour at CSS pixel (x, y)."""
    return tuple(
        page.evaluate(
            """([x, y]) => {
        const c = document.getElementById('map'), t = document.createElement('canvas'), k = c.width / c.clientWidth;
        t.width = c.width; t.height = c.height;
        const g = t.getContext('2d'); g.drawImage(c, 0, 0);
        return Array.from(g.getImageData(Math.round(x * k), Math.round(y * k), 1, 1).data.slice(0, 3));
    }""",
            [x, y],
        )
    )


def near(colour, expected, tolerance=3):
    return all(abs(a - b) <= tolerance for a, b in zip(colour, expected))


def position(page, pid):
    return page.evaluate("id => ragMap.screenPosition(id)", pid)


def next_frame(page):
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def only_local(page):
    return all(u == page.url_of_map or u.startswith("data:") for u in page.requests)


# ---------------------------------------------------------------- drawing


@needs_browser
def test_draws_the_points_with_webgl(browser, tmp_path):
    data = synthetic()
    page = open_map(browser, data, tmp_path)
    n = len(data["papers"]["ids"])
    assert page.evaluate("[ragMap.count, ragMap.renderer, document.body.dataset.renderer]") == [
        n,
        "webgl",
        "webgl",
    ]
    stats = canvas_stats(page)
    # three cluster colours, grey, edges
    assert stats["painted"] > 2000 and stats["colours"] >= 4, stats
    # A point is drawn where screenPosition says; the bottom edge is empty.
    p = position(page, "target")
    assert pixel(page, p["x"], p["y"]) != BG
    assert pixel(page, 640, 780) == BG
    labels = page.locator("#labels .label:visible")
    assert sorted(labels.all_text_contents()) == sorted(c["label"] for c in data["clusters"])
    assert page.locator("#title").text_content() == "Map of synthetic papers"
    assert page.locator("#subtitle").text_content() == f"{n} papers · 4 clusters"
    assert page.evaluate("ragMap.screenPosition('no-such-id')") is None
    assert only_local(page) and not page.errors, (page.requests, page.errors)
    page.close()


@needs_browser
def test_without_webgl_the_same_points_are_drawn_in_2d(browser, tmp_path):
    no_webgl = """{ const get = HTMLCanvasElement.prototype.getContext;
        HTMLCanvasElement.prototype.getContext = function (kind, ...rest) {
            return /webgl/.test(kind) ? null : get.call(this, kind, ...rest); }; }"""
    page = open_map(browser, synthetic(), tmp_path, init_script=no_webgl)
    assert page.evaluate("[ragMap.renderer, document.body.dataset.renderer]") == ["2d", "2d"]
    stats = canvas_stats(page)
    assert stats["painted"] > 2000 and stats["colours"] >= 4, stats
    p = position(page, "target")
    assert pixel(page, p["x"], p["y"]) != BG
    page.mouse.move(p["x"], p["y"])
    page.wait_for_function(
        "t => document.getElementById('tooltip').textContent === t", arg=PLACED["target"][0]
    )
    assert not page.errors, page.errors
    page.close()


# ---------------------------------------------------------------- hover and card


@needs_browser
@pytest.mark.parametrize(
    "screen",
    [{}, {"viewport": {"width": 600, "height": 700}, "device_scale_factor": 2}],
    ids=["1280x800", "600px-hidpi"],
)
def test_hover_shows_the_title_and_click_opens_the_card(browser, tmp_path, screen):
    page = open_map(browser, synthetic(), tmp_path, **screen)
    title = PLACED["target"][0]
    p = position(page, "target")
    page.mouse.move(p["x"], p["y"])
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert tip.text_content() == title
    page.mouse.move(p["x"] + 40, p["y"] + 40)  # nothing there
    tip.wait_for(state="hidden")

    page.mouse.click(p["x"], p["y"])
    card = page.locator("#card")
    card.wait_for(state="visible")
    assert page.locator("#card-title").text_content() == title
    assert page.locator("#card-authors").text_content() == "Ada Lovelace, Alan Turing"
    assert page.locator("#card-meta").text_content() == "ICLR 2024 · 2024"
    assert page.locator("#card-abstract").text_content() == "Abstract of target."
    assert page.locator("#card-cluster").text_content() == "graph · message passing"
    link = page.locator("#card-link")
    assert link.get_attribute("href") == "https://example.org/target"
    assert (link.get_attribute("target"), link.get_attribute("rel")) == (
        "_blank",
        "noopener noreferrer",
    )
    page.locator("#card-close").click()
    card.wait_for(state="hidden")
    assert page.evaluate("ragMap.select('rtl')") is True
    assert page.locator("#card-title").text_content() == RTL_TITLE
    assert (
        page.locator("#card-link").is_hidden() is False
        and page.locator("#card-cluster").is_hidden()
    )
    assert only_local(page) and not page.errors, (page.requests, page.errors)
    page.close()


@needs_browser
def test_poisoned_strings_stay_text(browser, tmp_path):
    data = synthetic(highlight={"cited": ["evil"], "retrieved": []}, question=HOSTILE_QUESTION)
    page = open_map(browser, data, tmp_path)
    p = position(page, "evil")
    page.mouse.move(p["x"], p["y"])
    page.locator("#tooltip").wait_for(state="visible")
    assert page.locator("#tooltip").text_content() == HOSTILE
    page.mouse.click(p["x"], p["y"])
    page.locator("#card").wait_for(state="visible")
    assert page.locator("#card-title").text_content() == HOSTILE
    assert page.locator("#card-cluster").text_content() == HOSTILE_LABEL
    assert page.locator("#card-link").is_hidden()  # a javascript: url gets no link
    assert page.locator("#card-link").get_attribute("href") is None
    assert page.locator("#question").text_content() == HOSTILE_QUESTION.strip()
    assert HOSTILE_LABEL in page.locator("#labels").text_content()
    assert page.evaluate("ragMap.search('onerror')") == 1
    assert page.locator("#results .t").all_text_contents() == [HOSTILE]
    page.locator("#results button").first.click()
    assert page.locator("#card-title").text_content() == HOSTILE
    assert page.evaluate("ragMap.select('long')") is True
    assert page.locator("#card-title").text_content() == LONG_WORD
    assert page.evaluate(
        "[typeof window.pwned, document.images.length, document.scripts.length]"
    ) == [
        "undefined",
        0,
        2,
    ]
    assert only_local(page) and not page.errors, (page.requests, page.errors)
    page.close()


# Records every CSP violation the page reports (an init script runs before the page's own, outside
# its CSP).
VIOLATIONS = """window.violations = [];
document.addEventListener("securitypolicyviolation", e => window.violations.push(e.effectiveDirective));"""
# What a markup injection past the escaping would add: an inline script, an inline style and a style
# attribute.
INJECTED = (
    "<script>window.injectedRan = 1;</script><style>#panel { position: static; }</style>"
    '<div id="injected" style="position: absolute"></div></body>'
)


@needs_browser
def test_the_hashed_csp_runs_the_pages_script_and_blocks_any_other(browser, tmp_path):
    data = synthetic()
    page = open_map(browser, data, tmp_path, init_script=VIOLATIONS)
    # The page's own script ran (open_map waited for ragMap.ready): it read the data, filled the
    # DOM, drew.
    assert (
        page.locator("#subtitle").text_content()
        == f"{len(data['papers']['ids'])} papers · 4 clusters"
    )
    assert canvas_stats(page)["painted"] > 2000
    # its style
    assert page.evaluate("getComputedStyle(document.getElementById('panel')).position") == "fixed"
    assert page.evaluate("window.violations") == [] and not page.errors, page.errors
    page.close()

    # The same page with injected markup: the script does not run, the style and the style attribute
    # do not apply.
    html = render_map_html(data).replace("</body>", INJECTED)
    page = open_map(
        browser, data, tmp_path, init_script=VIOLATIONS, name="injected.html", html=html
    )
    state = """() => [typeof window.injectedRan, getComputedStyle(document.getElementById('panel')).position,
                      getComputedStyle(document.getElementById('injected')).position]"""
    assert page.evaluate(state) == ["undefined", "fixed", "static"]
    assert sorted(page.evaluate("window.violations")) == [
        "script-src-elem",
        "style-src-attr",
        "style-src-elem",
    ]
    assert page.evaluate("ragMap.ready") is True
    page.close()

    # Control: under the policy the page had before ('unsafe-inline'), the same injection runs and
    # applies.
    loose = re.sub(
        r"script-src [^;]*; style-src [^;]*;",
        "script-src 'unsafe-inline'; style-src 'unsafe-inline';",
        html,
    )
    page = open_map(browser, data, tmp_path, init_script=VIOLATIONS, name="loose.html", html=loose)
    assert page.evaluate(state) == ["number", "static", "absolute"]
    page.close()


# ---------------------------------------------------------------- search


@needs_browser
def test_search_counts_lists_and_dims(browser, tmp_path):
    data = synthetic()
    page = open_map(browser, data, tmp_path)
    titles, authors = data["papers"]["titles"], data["papers"]["authors"]

    def expected(q):
        return [
            t for t, a in zip(titles, authors) if q.lower() in t.lower() or q.lower() in a.lower()
        ]

    before = canvas_stats(page)
    assert (
        page.evaluate("ragMap.search('GRAPH model number 1')")
        == len(expected("graph model number 1"))
        == 61
    )
    assert page.locator("#search").input_value() == "GRAPH model number 1"
    assert page.locator("#search-count").text_content() == "61 papers match"
    assert page.locator("#results .t").all_text_contents() == expected("graph model number 1")[:20]
    next_frame(page)
    assert canvas_stats(page)["painted"] != before["painted"]  # the rest is dimmed
    # Typing filters too, and authors match.
    page.locator("#search").fill("lovelace")
    page.wait_for_function(
        "document.getElementById('search-count').textContent === '1 paper matches'"
    )
    assert page.locator("#results .t").all_text_contents() == [PLACED["target"][0]]
    page.locator("#results button").first.click()
    page.locator("#card").wait_for(state="visible")
    assert page.locator("#card-title").text_content() == PLACED["target"][0]
    p = position(page, "target")  # centred in what the card leaves visible
    assert abs(p["x"] - (1280 / 2 - 190)) < 2 and abs(p["y"] - 400) < 2
    assert page.evaluate("ragMap.search('no paper has this')") == 0
    assert page.locator("#search-count").text_content() == "No papers match"
    assert page.evaluate("ragMap.search('  ')") == 0
    assert (
        page.locator("#search-count").text_content() == ""
        and page.locator("#results li").count() == 0
    )
    assert not page.errors, page.errors
    page.close()


# ---------------------------------------------------------------- pan and zoom


@needs_browser
def test_drag_pans_wheel_zooms_around_the_cursor_and_reset(browser, tmp_path):
    page = open_map(browser, synthetic(), tmp_path)
    home = position(page, "target")
    page.mouse.move(640, 560)
    page.mouse.down()
    page.mouse.move(700, 600, steps=4)
    page.mouse.move(740, 610, steps=4)
    page.mouse.up()
    moved = position(page, "target")
    assert abs(moved["x"] - home["x"] - 100) < 1.5 and abs(moved["y"] - home["y"] - 50) < 1.5
    assert page.locator("#card").is_hidden()  # a drag is not a click

    rtl = position(page, "rtl")
    page.mouse.move(moved["x"], moved["y"])
    page.mouse.wheel(0, -400)
    page.wait_for_function(
        "([x0, y0]) => { const p = ragMap.screenPosition('rtl'); return Math.hypot(p.x - x0, p.y -"
        " y0) > 1; }",
        arg=[rtl["x"], rtl["y"]],
    )
    still = position(page, "target")
    assert abs(still["x"] - moved["x"]) < 1 and abs(still["y"] - moved["y"]) < 1
    farther = position(page, "rtl")
    assert math.dist((farther["x"], farther["y"]), (still["x"], still["y"])) > 1.5 * math.dist(
        (rtl["x"], rtl["y"]), (moved["x"], moved["y"])
    )

    page.mouse.dblclick(640, 785)
    page.wait_for_function(
        "([x, y]) => { const p = ragMap.screenPosition('target');"
        " return Math.abs(p.x - x) < 0.5 && Math.abs(p.y - y) < 0.5; }",
        arg=[home["x"], home["y"]],
    )
    page.mouse.wheel(0, -400)
    page.locator("#reset").click()
    assert position(page, "target") == home
    page.set_viewport_size({"width": 900, "height": 600})
    page.wait_for_function("() => document.getElementById('map').width === 900")
    p = position(page, "target")
    assert 0 < p["x"] < 900 and 0 < p["y"] < 600
    assert not page.errors, page.errors
    page.close()


# ---------------------------------------------------------------- highlight


@needs_browser
def test_highlight_from_data_and_from_the_api(browser, tmp_path):
    data = synthetic(
        highlight={"cited": ["target", "nope"], "retrieved": ["graph-3", "target", "nope2"]},
        question="Which papers use sparse attention?",
    )
    page = open_map(browser, data, tmp_path)
    assert page.evaluate("ragMap.highlighted()") == {"cited": ["target"], "retrieved": ["graph-3"]}
    assert page.locator("#banner").is_visible()
    assert page.locator("#question").text_content() == "Which papers use sparse attention?"
    assert page.locator("#legend").text_content().split() == [
        "cited",
        "(1)",
        "retrieved,",
        "not",
        "cited",
        "(1)",
    ]
    p = position(page, "target")
    assert near(pixel(page, p["x"], p["y"]), CITED)  # the cited marker, drawn above the rest
    ring = pixel(page, p["x"] + 6.8, p["y"])
    assert max(ring) < 60, ring  # its dark outline
    q = position(page, "graph-3")
    assert near(pixel(page, q["x"], q["y"]), (255, 255, 255))  # the retrieved marker
    page.mouse.click(p["x"], p["y"])
    page.locator("#card").wait_for(state="visible")
    assert page.locator("#card-status").text_content() == "Cited in the answer"

    got = page.evaluate(
        "ragMap.highlight({cited: ['rtl', 'rtl', 'unknown'], retrieved: ['long'], question: 'Q2'})"
    )
    assert got == {"cited": ["rtl"], "retrieved": ["long"]} == page.evaluate("ragMap.highlighted()")
    assert page.locator("#question").text_content() == "Q2"
    next_frame(page)
    assert not near(pixel(page, p["x"], p["y"]), CITED)
    assert page.locator("#card-status").is_hidden()
    page.locator("#banner-clear").click()
    assert page.evaluate("ragMap.highlighted()") == {"cited": [], "retrieved": []}
    assert page.locator("#banner").is_hidden()
    assert page.evaluate("ragMap.highlight({cited: 'target'})") == {"cited": [], "retrieved": []}
    assert not page.errors, page.errors
    page.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def loopback_site(tmp_path):
    """tmp_path served over http on 127.0.0.1 (and so on localhost, another origin)."""
    handler = functools.partial(_QuietHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, server.server_address[1]
    server.shutdown()
    server.server_close()


PARENT = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="MAP" style="width:600px;height:500px;border:0"></iframe>
<script>
window.readies = 0;
window.addEventListener("message", (e) => {
  if (e.source !== document.getElementById("f").contentWindow || !e.data || e.data.type !== "rag-map-ready") return;
  window.readies++;
  e.source.postMessage({type: "rag-map-highlight", cited: ["target", "nope"], retrieved: ["long"],
                        question: "From the chat"}, location.origin);
});
EXTRA</script></body></html>"""
# On the cross-origin parent: what a page of another origin could try. It must be ignored.
POST_ON_LOAD = """document.getElementById("f").addEventListener("load", () => {
  document.getElementById("f").contentWindow.postMessage({type: "rag-map-highlight", cited: ["rtl"]}, "*");
  window.posted = true;
});"""


@needs_browser
def test_a_parent_frame_highlights_by_message(browser, loopback_site):
    root, port = loopback_site
    (root / "map.html").write_text(render_map_html(synthetic()), encoding="utf-8")
    (root / "parent.html").write_text(
        PARENT.replace("MAP", "map.html").replace("EXTRA", ""), encoding="utf-8"
    )
    cross = PARENT.replace("MAP", f"http://127.0.0.1:{port}/map.html").replace(
        "EXTRA", POST_ON_LOAD
    )
    (root / "cross.html").write_text(cross, encoding="utf-8")
    context = browser.new_context(viewport={"width": 800, "height": 600})
    context.set_default_timeout(DEADLINE_MS)
    page = context.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))

    page.goto(f"http://127.0.0.1:{port}/parent.html")
    page.wait_for_function("window.readies === 1")
    frame = next(f for f in page.frames if f.url.endswith("/map.html"))
    frame.wait_for_function("ragMap.highlighted().cited.length === 1")
    assert frame.evaluate("ragMap.highlighted()") == {"cited": ["target"], "retrieved": ["long"]}
    assert frame.locator("#question").text_content() == "From the chat"
    # A message the map posts to itself is not from its parent: ignored. The second message is a
    # marker: messages arrive in order, so once it has, the first has been handled.
    frame.evaluate("""() => new Promise(done => {
        window.addEventListener('message', e => { if (e.data === 'marker') done(); });
        window.postMessage({type: 'rag-map-highlight', cited: ['rtl'], retrieved: []}, '*');
        window.postMessage('marker', '*');
    })""")
    assert frame.evaluate("ragMap.highlighted()") == {"cited": ["target"], "retrieved": ["long"]}
    assert all(u.startswith(f"http://127.0.0.1:{port}/") for u in requests), requests

    # A parent of another origin (localhost is not 127.0.0.1) gets no ready message and cannot
    # highlight.
    page.goto(f"http://localhost:{port}/cross.html")
    frame = next(f for f in page.frames if f.url.endswith("/map.html"))
    frame.wait_for_function("window.ragMap && ragMap.ready")
    page.wait_for_function("window.posted === true")
    # A round trip of markers behind it (messages between two windows arrive in order): once the
    # parent has the frame's answer to its marker, the frame has handled the message posted before
    # the marker, and any message the frame posted to the parent before its answer (a ready) has
    # arrived.
    frame.evaluate(
        "() => window.addEventListener('message', e => { if (e.data === 'marker')"
        " parent.postMessage('back', '*'); })"
    )
    page.evaluate("""() => new Promise(done => {
        window.addEventListener('message', e => { if (e.data === 'back') done(); });
        document.getElementById('f').contentWindow.postMessage('marker', '*');
    })""")
    assert frame.evaluate("ragMap.highlighted()") == {"cited": [], "retrieved": []}
    assert page.evaluate("window.readies") == 0
    assert not errors, errors
    context.close()


@needs_browser
def test_a_single_paper_map(browser, tmp_path):
    one = {
        "ids": ["only"],
        "titles": ["The only paper"],
        "authors": [""],
        "years": [""],
        "venues": [""],
        "urls": [""],
        "abstracts": None,
        "x": [0.3],
        "y": [-0.2],
        "cluster": [-1],
    }
    page = open_map(browser, {"title": "Map of 1 paper", "papers": one, "clusters": []}, tmp_path)
    assert page.evaluate("[ragMap.count, ragMap.renderer]") == [1, "webgl"]
    assert page.locator("#subtitle").text_content() == "1 paper · 0 clusters"
    p = position(page, "only")
    assert abs(p["x"] - 640) < 1 and abs(p["y"] - 400) < 1
    page.mouse.click(p["x"], p["y"])
    page.locator("#card").wait_for(state="visible")
    assert page.locator("#card-title").text_content() == "The only paper"
    assert page.locator("#card-authors").is_hidden() and page.locator("#card-link").is_hidden()
    assert not page.errors, page.errors
    page.close()


# ---------------------------------------------------------------- size


@needs_browser
def test_100k_points_load_and_respond(browser, tmp_path):
    n = 100_000
    rng = random.Random(3)
    centres = [(rng.uniform(-0.8, 0.8), rng.uniform(-0.8, 0.8)) for _ in range(40)]
    cluster = [rng.randrange(40) for _ in range(n)]
    papers = {
        "ids": [f"p{i}" for i in range(n)],
        "titles": [f"Synthetic paper {i}" for i in range(n)],
        "authors": [f"Author {i % 1000}" for i in range(n)],
        "years": ["2025"] * n,
        "venues": ["ICML"] * n,
        "urls": [""] * n,
        "abstracts": None,
        "x": [rng.gauss(centres[c][0], 0.07) for c in cluster],
        "y": [rng.gauss(centres[c][1], 0.07) for c in cluster],
        "cluster": cluster,
    }
    clusters = [
        {"label": f"topic{k} · term{k}", "x": x, "y": y, "size": cluster.count(k)}
        for k, (x, y) in enumerate(centres)
    ]
    started = time.monotonic()
    page = open_map(
        browser,
        {"title": "Map of 100,000 papers", "papers": papers, "clusters": clusters},
        tmp_path,
    )
    loaded = time.monotonic() - started
    assert page.evaluate("[ragMap.count, ragMap.renderer]") == [n, "webgl"]
    assert canvas_stats(page)["colours"] > 20
    assert 0 < page.locator("#labels .label:visible").count() <= 40
    # Hover hit-testing on the grid index: nearest point, quickly, at many spots.
    took = page.evaluate("""() => {
        const t0 = performance.now(), c = document.getElementById('map');
        for (let k = 0; k < 200; k++)
            c.dispatchEvent(new PointerEvent('pointermove', {clientX: 200 + k * 4, clientY: 150 + k * 2.5}));
        return performance.now() - t0; }""")
    assert took < 2000, took
    p = position(page, "p4242")
    page.mouse.move(p["x"], p["y"])
    page.locator("#tooltip").wait_for(state="visible")
    hovered = page.locator("#tooltip").text_content()
    assert hovered.startswith("Synthetic paper ")  # points overlap at this density: the nearest one
    assert page.evaluate("ragMap.search('synthetic paper 4242')") == 11  # and 42420-42429
    print(f"100k points: loaded in {loaded:.1f} s, 200 hovers in {took:.0f} ms")
    assert only_local(page) and not page.errors, page.errors
    page.close()


# ---------------------------------------------------------------- labels, cards, abstract search,
# the answer's markers

SIZES = [{"width": 1440, "height": 900}, {"width": 1280, "height": 720}]
TERMS = [
    "diffusion",
    "graph",
    "policy",
    "reward",
    "attention",
    "sparse",
    "kernel",
    "bandits",
    "privacy",
    "federated",
    "Vision-Language-Action",
    "molecular",
    "protein",
    "hallucination",
    "retrieval",
    "alignment",
    "quantization",
]


def crowded(k=40, per=25, seed=11, **extra) -> dict:
    """k clusters packed close (the ICML 2026 map has 38), each labelled with three terms of varied
    length, so that not every label fits: the page must choose, never overlap, never cut one off."""
    rng = random.Random(seed)
    centres = [(rng.uniform(-0.95, 0.95), rng.uniform(-0.95, 0.95)) for _ in range(k)]
    cols: dict[str, list] = {
        key: []
        for key in (
            "ids",
            "titles",
            "authors",
            "years",
            "venues",
            "urls",
            "abstracts",
            "x",
            "y",
            "cluster",
        )
    }
    for c, (cx, cy) in enumerate(centres):
        for j in range(per):
            for key, value in zip(
                cols,
                (
                    f"c{c}-{j}",
                    f"Paper {j} of cluster {c}",
                    "A. Author",
                    "2026",
                    "ICML 2026",
                    "",
                    f"Abstract {c}-{j}.",
                    rng.gauss(cx, 0.04),
                    rng.gauss(cy, 0.04),
                    c,
                ),
            ):
                cols[key].append(value)
    labels = [" · ".join(rng.sample(TERMS, 3)) for _ in range(k)]
    clusters = [
        {"label": label, "x": x, "y": y, "size": per + (k - c)}
        for c, (label, (x, y)) in enumerate(zip(labels, centres))
    ]
    return {"title": "Crowded", "papers": cols, "clusters": clusters, **extra}


LABEL_BOXES = """() => {
    const box = (e) => { const r = e.getBoundingClientRect(); return {x: r.left, y: r.top, r: r.right, b: r.bottom}; };
    const shown = [...document.querySelectorAll('#labels .label')].filter(e => getComputedStyle(e).visibility === 'visible');
    return {labels: shown.map(e => ({text: e.textContent, cut: e.scrollWidth > e.clientWidth + 1
                                      || e.scrollHeight > e.clientHeight + 1, ...box(e)})),
            boxes: ['panel', 'controls', 'banner', 'card'].map(id => document.getElementById(id))
                   .filter(e => !e.hidden).map(box),
            canvas: box(document.getElementById('map'))};
}"""


def overlap(a, b) -> bool:
    return a["x"] < b["r"] and b["x"] < a["r"] and a["y"] < b["b"] and b["y"] < a["b"]


def assert_labels_clear(page):
    """Every label shown: whole (no ellipsis, no clipped text), inside the canvas, over no other
    label and no box of the page. Returns the shown labels' texts."""
    got = page.evaluate(LABEL_BOXES)
    labels, canvas = got["labels"], got["canvas"]
    assert labels
    for i, a in enumerate(labels):
        assert not a["cut"], a
        assert (
            canvas["x"] <= a["x"]
            and a["r"] <= canvas["r"]
            and canvas["y"] <= a["y"]
            and a["b"] <= canvas["b"]
        ), a
        assert not [b["text"] for b in labels[i + 1 :] if overlap(a, b)], a["text"]
        assert not [b for b in got["boxes"] if overlap(a, b)], a["text"]
    return [a["text"] for a in labels]


@needs_browser
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}x{s['height']}")
def test_cluster_labels_never_overlap_nor_leave_the_map(browser, tmp_path, size):
    page = open_map(
        browser,
        crowded(highlight={"cited": ["c3-1", "c3-2"], "retrieved": ["c5-0"]}, question="Q"),
        tmp_path,
        viewport=size,
    )
    assert len(assert_labels_clear(page)) >= 10
    page.mouse.move(size["width"] / 2, size["height"] / 2)
    page.mouse.wheel(0, -500)  # zoomed in, labels near the edges slide inside or hide
    next_frame(page)
    assert_labels_clear(page)
    page.set_viewport_size({"width": 700, "height": 500})  # a narrow frame, as beside the chat
    page.wait_for_function("() => document.getElementById('map').width === 700")
    next_frame(page)
    assert 5 <= len(assert_labels_clear(page)) < 40  # crowded: some shown, not all
    assert not page.errors, page.errors
    page.close()


@needs_browser
def test_a_card_names_only_a_cluster_shown_on_the_map(browser, tmp_path):
    data = crowded()
    page = open_map(browser, data, tmp_path, viewport={"width": 800, "height": 600})
    hidden_at_first = set(c["label"] for c in data["clusters"]) - set(assert_labels_clear(page))
    assert hidden_at_first  # the test needs some
    named_hidden = 0
    for c, cluster in enumerate(data["clusters"]):
        assert page.evaluate("id => ragMap.select(id)", f"c{c}-0") is True
        next_frame(page)
        shown = assert_labels_clear(page)  # the card is a box the labels keep clear of
        chip = page.locator("#card-cluster")
        assert chip.is_hidden() or chip.text_content() in shown, (c, chip.text_content())
        named_hidden += chip.is_visible() and cluster["label"] in hidden_at_first
        page.locator("#card-close").click()
    # a cluster hidden at first is shown (and named) while its paper's card is open
    assert named_hidden >= 1
    assert not page.errors, page.errors
    page.close()


@needs_browser
def test_search_finds_words_only_in_abstracts_and_says_where(browser, tmp_path):
    data = synthetic()
    abstracts = data["papers"]["abstracts"]
    where = [3, 160, 310]  # one paper in each blob names the method in its abstract only
    for i in where:
        abstracts[i] = f"We introduce Palimpsa-X, a metaplastic attention model. Paper {i}."
    data["papers"]["titles"][7] = "Palimpsa-X in the title"
    page = open_map(browser, data, tmp_path)
    assert (
        page.locator("#search").get_attribute("placeholder") == "Search titles, authors, abstracts"
    )
    assert page.evaluate("ragMap.search('palimpsa-x')") == 4
    assert page.locator("#search-count").text_content() == "4 papers match (3 in the abstract only)"
    titles = page.locator("#results .t").all_text_contents()
    assert titles[0] == "Palimpsa-X in the title"  # title matches first
    assert titles[1:] == [data["papers"]["titles"][i] for i in where]
    said = page.locator("#results .s.where")
    assert said.count() == 3 and all(
        t.startswith("abstract: We introduce Palimpsa-X") for t in said.all_text_contents()
    )
    assert page.locator("#results .s.where mark").all_text_contents() == ["Palimpsa-X"] * 3
    page.locator("#results button").nth(1).click()
    assert page.locator("#card-title").text_content() == data["papers"]["titles"][3]
    assert page.evaluate("ragMap.search('metaplastic attention')") == 3
    assert page.locator("#search-count").text_content() == "3 papers match, in the abstracts"
    # A page without abstracts (maps over 20,000 papers) searches and says titles and authors.
    data["papers"]["abstracts"] = None
    bare = open_map(browser, data, tmp_path, name="bare.html")
    assert bare.locator("#search").get_attribute("placeholder") == "Search titles and authors"
    assert bare.evaluate("ragMap.search('metaplastic')") == 0
    assert not page.errors and not bare.errors, (page.errors, bare.errors)
    page.close(), bare.close()


def crowded_answer(**extra) -> dict:
    """An answer's six cited and three retrieved papers sitting almost on one spot, as neighbours
    do."""
    data = synthetic(**extra)
    p = data["papers"]
    for j, pid in enumerate([f"graph-{k}" for k in range(9)]):
        i = p["ids"].index(pid)
        p["x"][i], p["y"][i] = 0.55 + 0.004 * (j % 3), 0.45 + 0.004 * (j // 3)
    data["highlight"] = {
        "cited": [f"graph-{k}" for k in range(6)],
        "retrieved": [f"graph-{k}" for k in range(6, 9)],
    }
    return data


@needs_browser
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}x{s['height']}")
def test_the_answers_markers_do_not_cover_each_other(browser, tmp_path, size):
    page = open_map(browser, crowded_answer(), tmp_path, viewport=size)
    for zoom in (0, -600):  # at the whole map's scale, then zoomed in around the markers
        spot = position(page, "graph-4")
        page.mouse.move(spot["x"], spot["y"])
        page.mouse.wheel(0, zoom)
        next_frame(page)
        markers = page.evaluate("ragMap.markers()")
        assert len(markers) == 9
        for i, a in enumerate(markers):
            for b in markers[i + 1 :]:
                assert math.dist((a["x"], a["y"]), (b["x"], b["y"])) >= a["r"] + b["r"], (a, b)
            assert math.dist((a["x"], a["y"]), (a["px"], a["py"])) < 60  # near its paper's point
        # Drawn where they are said to be: each cited marker's centre is the cited fill; a click
        # opens its card.
        for m in markers:
            if m["kind"] == "cited":
                assert near(pixel(page, m["x"], m["y"]), CITED), m
        target = markers[4]
        page.mouse.click(target["x"], target["y"])
        page.wait_for_function(
            "id => document.getElementById('card').dataset.id === id", arg=target["id"]
        )
        page.locator("#card-close").click()
    # leader lines
    assert (
        page.evaluate("document.querySelector('#leaders path').getAttribute('d')").count("M") >= 8
    )
    assert not page.errors, page.errors
    page.close()
