"""The map in the chat UI and `rag map` pages, in a real headless Chromium over real stores.

The seed store (76 papers) drives the chat: the map beside it lights up the papers of the answer
shown, and follows the "Sources for answer" selector back to an earlier answer. A store of 2,100
ICML 2026 main-track records drawn at random from the whole track, plus one record with a poisoned
title (ingested once for this module), proves the map page of a real multi-thousand-paper corpus.
Over 2,000 papers, the layout takes the path a full corpus takes (t-SNE with approximate neighbours;
see rag/paper_map/layout.py); the whole 5.9k track cost three minutes of ingest for no other code
path (the page itself is driven with 100k points in tests/test_map_page.py). That store's vectors
come from rag.testing.HashEmbedder (a fake: hashed words, no model), since what is asserted of it is
the layout, the clusters, the labels and the page, not which papers a question finds; `rag map`
itself (the command, with MiniLM) is driven on the seeds below and in tests/test_paper_map.py.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import shutil
import time

import pytest

from rag import RAG
from rag.cli import _map, build_parser
from rag.testing import HashEmbedder
from rag.ui.app import launch
from tests.conftest import SHARED, run_cli
from tests.servers import free_port
from tests.test_map_page import SIZES, assert_labels_clear
from tests.test_ui import (
    ARTIFACTS,
    QUESTION,
    ask,
    assert_loopback_only,
    needs_browser,
    open_page,
    show_turn,
)

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

SECOND_QUESTION = "Which papers study backdoor attacks on language models?"


@pytest.fixture(scope="module")
def seed_ui(seed_store, tmp_path_factory):
    store = tmp_path_factory.mktemp("ui_map") / "store"
    shutil.copytree(seed_store, store)
    rag = RAG(store_dir=store, llm="none")
    port = free_port()
    demo = launch(rag, port=port, block=False)
    yield rag, f"http://127.0.0.1:{port}/"
    demo.close()


def map_frame(page):
    from playwright.sync_api import Error as PlaywrightError

    page.get_by_role("tab", name="Map").click()
    page.wait_for_function("document.querySelector('#map-frame') !== null")
    frame = page.frame(url=re.compile(r"/map$"))
    for _ in range(600):  # the layout runs once, in the background, at launch
        frame = page.frame(url=re.compile(r"/map$"))
        try:
            if frame is not None and frame.evaluate("!!(window.ragMap && window.ragMap.ready)"):
                return frame
        except PlaywrightError:  # the frame (re)loaded while asked, on a busy machine: ask again
            pass
        page.wait_for_timeout(200)
    raise AssertionError("the map never became ready")


def wait_highlight(frame, cited: list[str]):
    frame.wait_for_function(
        "ids => JSON.stringify(window.ragMap.highlighted().cited.slice().sort()) === "
        "JSON.stringify(ids.slice().sort())",
        arg=cited,
        timeout=60_000,
    )
    return frame.evaluate("window.ragMap.highlighted()")


@needs_browser
def test_the_map_beside_the_chat_lights_up_the_answer_shown(browser, seed_ui):
    rag, url = seed_ui
    page, _ = open_page(browser, url)
    frame = map_frame(page)
    assert frame.evaluate("window.ragMap.count") == 76
    assert frame.evaluate("window.ragMap.highlighted()") == {"cited": [], "retrieved": []}

    first = rag.ask(QUESTION, llm=False)
    ask(page, QUESTION)
    cited1 = list(dict.fromkeys(s.paper_id for s in first.cited_sources))
    shown = wait_highlight(frame, cited1)
    assert cited1 and set(shown["retrieved"]) == {s.paper_id for s in first.sources} - set(cited1)
    page.screenshot(path=str(ARTIFACTS / "ui_map_answer.png"))

    second = rag.ask(SECOND_QUESTION, llm=False)
    ask(page, SECOND_QUESTION, turn=2)
    cited2 = list(dict.fromkeys(s.paper_id for s in second.cited_sources))
    assert cited2 and set(cited2) != set(cited1)
    wait_highlight(frame, cited2)
    page.get_by_role("tab", name="Sources").click()
    show_turn(page, 1)  # an earlier answer: the highlight moves with it
    page.get_by_role("tab", name="Map").click()
    wait_highlight(frame, cited1)
    assert_loopback_only(page, url)
    page.close()


@needs_browser
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}x{s['height']}")
def test_the_map_beside_the_chat_fits_the_screen_with_every_label_clear(browser, seed_ui, size):
    rag, url = seed_ui
    page, _ = open_page(browser, url)
    page.set_viewport_size(size)
    ask(page, QUESTION)
    frame = map_frame(page)
    wait_highlight(
        frame, list(dict.fromkeys(s.paper_id for s in rag.ask(QUESTION, llm=False).cited_sources))
    )
    box = page.locator("#map-frame").bounding_box()
    # the whole map on screen
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"] + 1, box
    frame.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    clusters = frame.evaluate("document.querySelectorAll('#labels .label').length")
    # every cluster a card can name is shown
    assert len(assert_labels_clear(frame)) == clusters == 4
    markers = frame.evaluate("ragMap.markers()")
    assert all(
        math.dist((a["x"], a["y"]), (b["x"], b["y"])) >= a["r"] + b["r"]
        for i, a in enumerate(markers)
        for b in markers[i + 1 :]
    ), markers
    page.screenshot(path=str(ARTIFACTS / f"ui_map_{size['width']}.png"))
    page.close()


@needs_browser
def test_a_map_opened_after_the_answer_shows_its_papers(browser, seed_ui):
    rag, url = seed_ui
    page, _ = open_page(browser, url)
    answer = rag.ask(QUESTION, llm=False)
    ask(page, QUESTION)
    frame = map_frame(page)  # the iframe loads now and asks the chat for the current highlight
    wait_highlight(frame, list(dict.fromkeys(s.paper_id for s in answer.cited_sources)))
    page.close()


# records; over 2,000 papers t-SNE finds neighbours as it does for the whole track
ICML_SAMPLE = 2_100
POISON_ID = "POISON0001"
POISON = {
    "id": POISON_ID,
    "title": '<img src=x onerror="window.pwned=1"></script><script>window.pwned=2</script>',
    "abstract": (
        "A study of gradient descent on poisoned titles that should be shown as text, not run."
    ),
    "url": f"https://openreview.net/forum?id={POISON_ID}",
}


@pytest.fixture(scope="module")
def icml_store(tmp_path_factory) -> RAG:
    """2,100 records drawn at random (fixed seed) from the 5,862 of the ICML 2026 main track (the
    large data set: more than the shipped sample holds, for t-SNE's approximate path), as they are
    in the file (every session's topics; records without an id included), and the poisoned title.

    Indexed in-process with HashEmbedder (a fake, see the module docstring): 5 CPU-seconds instead
    of MiniLM's 127 (~70 s of CI's serial run), which already took its fastest path there, torch in
    bfloat16 under the [fast] extra (bench/studies/ui_map_fixture.py measures both). The titles,
    abstracts, chunks, keyword index, layout, clusters and labels are the real code's on the real
    records; only the vectors are hashed words."""
    with gzip.open(SHARED / "data" / "icml2026_main.jsonl.gz", "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    keep = sorted(random.Random(2026).sample(range(len(lines)), ICML_SAMPLE))
    tmp = tmp_path_factory.mktemp("icml_map")
    corpus = tmp / "icml_sample.jsonl"
    corpus.write_text(
        "".join(lines[i] + "\n" for i in keep) + json.dumps(POISON) + "\n", encoding="utf-8"
    )
    # Hashed-word cosines run lower than MiniLM's, for which the default abstain threshold (0.3) is
    # set: the best passage for the question asked below scores 0.27 here, so the threshold is
    # lowered for this store.
    rag = RAG(store_dir=tmp / "store", embedder=HashEmbedder(), llm="none", abstain_threshold=0.15)
    assert rag.ingest([corpus], include_corpus=False).new_papers == ICML_SAMPLE + 1
    return rag


@needs_browser
@pytest.mark.large_data
def test_the_map_of_2k_icml_papers_renders_with_a_poisoned_title_as_text(
    browser, icml_store, tmp_path, capsys
):
    out = tmp_path / "icml.html"
    # `rag map --out ... --ask ...` as the command parses and runs it, on the RAG holding the fake
    # embedder (the command would build its own, with MiniLM, and refuse this store's vectors).
    args = build_parser().parse_args(
        [
            "map",
            "--out",
            str(out),
            "--ask",
            "How can a Bayesian optimization run decide when to stop?",
        ]
    )
    assert _map(icml_store, args) == 0
    stdout = capsys.readouterr().out
    n = icml_store.stats()["papers"]
    said = re.match(
        rf"wrote {re.escape(str(out))}: {n:,} papers in (\d+) clusters; lit up: [1-9]", stdout
    )
    assert said and 20 <= int(said.group(1)) <= 40 and n > 2000
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda req: requests.append(req.url))
    page.goto(out.as_uri())
    page.wait_for_function("window.ragMap && window.ragMap.ready", timeout=120_000)
    assert (
        page.evaluate("window.ragMap.count") == n
        and page.evaluate("window.ragMap.renderer") == "webgl"
    )
    lit = page.evaluate("window.ragMap.highlighted()")
    assert lit["cited"]
    # Hovering the first cited paper names it; a click opens its card.
    pos = page.evaluate("id => window.ragMap.screenPosition(id)", lit["cited"][0])
    page.mouse.move(pos["x"], pos["y"])
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert tip.inner_text().strip()
    page.screenshot(path=str(ARTIFACTS / "map_icml.png"))
    for size in SIZES:  # the labels of a real map: whole, inside, apart, at both sizes
        page.set_viewport_size(size)
        page.wait_for_function("w => document.getElementById('map').width === w", arg=size["width"])
        page.evaluate(
            "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )
        assert len(assert_labels_clear(page)) >= 20
        markers = page.evaluate("ragMap.markers()")
        assert all(
            math.dist((a["x"], a["y"]), (b["x"], b["y"])) >= a["r"] + b["r"]
            for i, a in enumerate(markers)
            for b in markers[i + 1 :]
        ), markers
    # The poisoned title among the thousands: found by search, shown as text in its card, never run.
    assert page.evaluate("window.ragMap.search('onerror')") == 1
    page.evaluate("id => window.ragMap.select(id)", POISON_ID)
    card = page.locator("#card")
    assert "<img src=x" in card.inner_text() and "</script><script>" in card.inner_text()
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
    assert [u for u in requests if not u.startswith(("file://", "data:"))] == []
    context.close()


@needs_browser
def test_a_poisoned_title_on_the_map_stays_text(browser, seed_ui, tmp_path):
    rag, _ = seed_ui
    poison = tmp_path / "poison.jsonl"
    poison.write_text(
        '{"id": "POISON0001", "title": "<img src=x onerror=\\"window.pwned=1\\"></script><script>'
        'window.pwned=2</script>", "abstract": "A study of gradient descent on poisoned titles '
        'that should be shown as text, not run."}\n',
        encoding="utf-8",
    )
    store = tmp_path / "store"
    shutil.copytree(rag.store.dir, store)
    # Added in-process (a real ingest: MiniLM, Chroma), then mapped by the command: `rag map` places
    # it on the cached map of the seeds.
    assert RAG(store_dir=store, llm="none").ingest([poison], include_corpus=False).new_papers == 1
    out = tmp_path / "map.html"
    assert run_cli("map", "--store", str(store), "--out", str(out)).returncode == 0
    page = browser.new_page()
    page.goto(out.as_uri())
    page.wait_for_function("window.ragMap && window.ragMap.ready")
    assert page.evaluate("window.ragMap.search('onerror')") == 1
    page.evaluate("window.ragMap.select('POISON0001')")
    card = page.locator("#card")
    assert "<img src=x" in card.inner_text() and "</script><script>" in card.inner_text()
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0
    page.close()


def test_the_map_route_needs_the_login_when_the_chat_has_one(seed_store, tmp_path):
    import httpx

    store = tmp_path / "store"
    shutil.copytree(seed_store, store)
    port = free_port()
    demo = launch(RAG(store_dir=store, llm="none"), port=port, block=False, auth="alice:s3cret-pw")
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(trust_env=False, timeout=120) as c:
            r = c.get(url + "/map")
            assert r.status_code == 401 and "log in" in r.json()["detail"]
            assert (
                c.post(
                    url + "/login", data={"username": "alice", "password": "s3cret-pw"}
                ).status_code
                == 200
            )
            for _ in range(300):  # laid out in the background since launch
                r = c.get(url + "/map")
                if 'id="map-data"' in r.text:
                    break
                assert r.status_code == 200 and 'id="map-pending"' in r.text
                time.sleep(0.2)
            assert r.status_code == 200 and 'id="map-data"' in r.text
            assert "frame-ancestors 'self'" in r.headers["content-security-policy"]
    finally:
        demo.close()
