"""The browser chat's latency, measured in headless Chromium (Debian's, via Playwright).

    python -m bench.serving.ui [--store DIR] [--runs 5] [--no-llm-server] [--max-tokens 128]
[--context-tokens 1000] [--screenshot PATH] [--json FILE] python -m bench.serving.ui --screenshots
docs/ [--store DIR] [--map-store DIR]

`--screenshots DIR` measures nothing: it writes the documentation's screenshots instead, the chat
with an answer and its sources (ui_chat_1440.png, ui_chat_1280.png) and the map beside it with that
answer's papers lit up (ui_map_1440.png, ui_map_1280.png), at 1440x900 and 1280x720, extractive (no
LLM), each PNG reduced to 256 colours when it is over 300 KB. With `--map-store` (e.g. the ICML 2026
store) it also writes map.png: that store's `rag map --ask` page at 1280x800. Given stores are
copied first (the map caches its layout in the store it draws).

For each mode - extractive (no LLM) and an LLM answering through llama.cpp's OpenAI-compatible
server (SmolLM2-135M, one thread each for decoding and prompt processing, as in tests/harness.py) -
it serves `rag.ui.app.launch` in process and, for each of `--runs` questions, opens a fresh page and
measures:

- page load: navigation start -> the question box is on screen (Gradio has fetched its config and
  rendered), and -> the `load` event;
- Enter -> answer bubble: the question is echoed and an empty answer bubble (with the cursor) shown;
- Enter -> first streamed character: the keydown of Enter in the question box -> the first moment
  the answer bubble holds text other than the streaming cursor;
- Enter -> complete answer: -> the cursor is gone and the answer, its links and its sources are
  shown.

All three are taken in the page (performance.now(), a MutationObserver on the chat), so they include
the Gradio round trips and rendering, not Playwright's own latency. Beside them, the same questions
go through `RAG.stream` directly (no UI), to show what the UI adds. Medians over the runs (after one
warm-up question per mode). Questions rotate, so consecutive LLM prompts never share their sources
(llama.cpp would reuse a repeated prompt's cache).

The store defaults to a fresh one built from corpus/ (76 seed papers) in a temp dir.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.helpers import REPO, machine_load, write_json

CHROMIUM = "/usr/bin/chromium"
QUESTIONS = [
    "How does Palimpsa relate to Mamba2?",
    "Which papers study backdoor attacks on language models?",
    "How can a Bayesian optimization run decide when to stop?",
    "What methods make mixture-of-experts routing more efficient?",
    "What does CAMP model to balance truthfulness against helpfulness in preference alignment?",
    "Which papers evaluate LLM agents on real software tasks?",
    "What is known about in-context learning in transformers?",
]
WARMUP = "What do the indexed papers say about reinforcement learning from human feedback?"

WATCH = """() => {
  window.__t = {};
  const box = document.querySelector('#question textarea');
  box.addEventListener('keydown', e => {
    if (e.key === 'Enter' && !e.shiftKey && window.__t.enter === undefined) window.__t.enter = performance.now();
  }, {capture: true});
  const chat = document.querySelector('#chat');
  new MutationObserver(() => {
    const bots = chat.querySelectorAll('[data-testid=bot]');
    if (!bots.length || window.__t.enter === undefined) return;
    if (window.__t.bubble === undefined) window.__t.bubble = performance.now();
    const text = bots[bots.length - 1].innerText;
    const body = text.replaceAll('\\u258c', '').trim();
    const now = performance.now();
    if (body && window.__t.first === undefined) window.__t.first = now;
    const panel = document.querySelector('#sources .src-panel');
    if (body && !text.includes('\\u258c') && panel && panel.dataset.turn === '1'
        && !panel.innerText.includes('Finding sources') && window.__t.done === undefined) window.__t.done = now;
  }).observe(document.querySelector('#gradio-app, gradio-app') || document.body,
             {subtree: true, childList: true, characterData: true});
}"""


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def measure_ui(browser, url: str, question: str, screenshot: Path | None = None) -> dict:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    page.locator("#question textarea").wait_for(timeout=60_000)
    ready = page.evaluate("performance.now()")  # ms since navigation start
    page.wait_for_load_state("load")
    nav = page.evaluate(
        "(() => { const n = performance.getEntriesByType('navigation')[0];"
        " return {load: n.loadEventEnd, dcl: n.domContentLoadedEventEnd}; })()"
    )
    page.evaluate(WATCH)
    box = page.locator("#question textarea")
    box.fill(question)
    box.press("Enter")
    page.wait_for_function("window.__t.done !== undefined", timeout=300_000, polling=50)
    t = page.evaluate("window.__t")
    if screenshot is not None:
        page.wait_for_timeout(300)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot), full_page=True)
    left = [u for u in requests if not u.startswith((url, "data:", "blob:"))]
    context.close()
    if left:
        raise SystemExit(f"requests left loopback: {left}")
    return {
        "page_ready_ms": ready,
        "page_load_event_ms": nav["load"],
        "bubble_ms": t["bubble"] - t["enter"],
        "first_char_ms": t["first"] - t["enter"],
        "complete_ms": t["done"] - t["enter"],
    }


def measure_direct(rag, question: str) -> dict:
    t0 = time.perf_counter()
    first = None
    stream = rag.stream(question)
    for piece in stream:
        if piece.strip() and first is None:
            first = time.perf_counter() - t0
    answer = stream.answer
    return {
        "first_char_ms": 1000 * first if first is not None else None,
        "complete_ms": 1000 * (time.perf_counter() - t0),
        "answered_by": "abstained"
        if answer.abstained
        else answer.mode + (" (error)" if answer.error else ""),
    }


def run_mode(name: str, rag, browser, runs: int, screenshot: Path | None) -> dict:
    from rag.ui.app import launch
    from tests.harness import free_port

    port = free_port()
    demo = launch(rag, port=port, block=False)
    url = f"http://127.0.0.1:{port}/"
    try:
        measure_ui(browser, url, WARMUP)
        measure_direct(rag, WARMUP)
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(runs)]
        ui = [
            measure_ui(browser, url, q, screenshot if i == runs - 1 else None)
            for i, q in enumerate(questions)
        ]
        direct = [measure_direct(rag, q) for q in questions]
    finally:
        demo.close()
    out = {key: median([r[key] for r in ui]) for key in ui[0]}
    out.update(
        {
            f"direct_{key}": median([r[key] for r in direct])
            for key in ("first_char_ms", "complete_ms")
        }
    )
    out["answered_by"] = dict(Counter(r["answered_by"] for r in direct))
    out["runs"] = runs
    out["samples"] = {"ui": ui, "direct": direct}
    print(
        f"  {name}: "
        + ", ".join(f"{k} {v:.0f}" for k, v in out.items() if isinstance(v, float))
        + f"; answered by {out['answered_by']}",
        flush=True,
    )
    return out


SHOT_SIZES = ((1440, 900), (1280, 720))
# math in the answer
SHOT_QUESTION = "Are neurons faithful and stable atoms of large language models?"
SHOT_MAX_BYTES = 300_000
# software WebGL for the map
WEBGL_ARGS = ["--enable-unsafe-swiftshader", "--use-angle=swiftshader"]


def _small_png(path: Path) -> int:
    """The PNG's size in bytes, after reducing it to 256 colours if it is over SHOT_MAX_BYTES."""
    if path.stat().st_size > SHOT_MAX_BYTES:
        from PIL import Image

        with Image.open(path) as image:
            image.convert("RGB").quantize(256, dither=Image.Dither.NONE).save(path, optimize=True)
    return path.stat().st_size


def take_screenshots(browser, store: Path, out: Path) -> list[Path]:
    """The chat with an answer and its sources, and the map beside it, at each of SHOT_SIZES."""
    import re

    from playwright.sync_api import Error as PlaywrightError

    from rag import RAG
    from rag.ui.app import launch
    from tests.harness import free_port

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    demo = launch(RAG(store_dir=store, llm="none"), port=port, block=False)
    url, written = f"http://127.0.0.1:{port}/", []
    try:
        for width, height in SHOT_SIZES:
            context = browser.new_context(viewport={"width": width, "height": height})
            page = context.new_page()
            page.goto(url)
            box = page.locator("#question textarea")
            box.wait_for(timeout=120_000)
            box.fill(SHOT_QUESTION)
            box.press("Enter")
            page.wait_for_function(
                "() => { const p = document.querySelector('#sources .src-panel');"
                " const b = document.querySelector('#chat [data-testid=bot]');"
                " return p && p.dataset.turn === '1' && b && !b.innerText.includes('\u258c'); }",
                timeout=300_000,
            )
            page.wait_for_timeout(500)
            chat = out / f"ui_chat_{width}.png"
            page.screenshot(path=str(chat))
            page.get_by_role("tab", name="Map").click()
            for _ in range(1500):  # laid out in the background since launch
                frame = page.frame(url=re.compile(r"/map$"))
                try:
                    if frame is not None and frame.evaluate(
                        "!!(window.ragMap && ragMap.ready && ragMap.highlighted().cited.length)"
                    ):
                        break
                except PlaywrightError:  # the "laying out" page reloads itself meanwhile
                    pass
                page.wait_for_timeout(200)
            else:
                raise SystemExit("the map never showed the answer's papers")
            page.wait_for_timeout(500)
            shown = out / f"ui_map_{width}.png"
            page.screenshot(path=str(shown))
            context.close()
            for path in (chat, shown):
                print(f"wrote {path} ({_small_png(path) / 1000:.0f} KB)", flush=True)
                written.append(path)
    finally:
        demo.close()
    return written


MAP_QUESTION = "How can a Bayesian optimization run decide when to stop?"


def map_screenshot(browser, store: Path, out: Path) -> Path:
    """The `rag map --ask` page of a store (a copy of it), as a reader first sees it, at
    1280x800."""
    import os
    import subprocess

    page_file = store.parent / "map.html"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    subprocess.run(
        ["rag", "map", "--store", str(store), "--out", str(page_file), "--ask", MAP_QUESTION],
        check=True,
        env=env,
    )
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(page_file.as_uri())
    page.wait_for_function("window.ragMap && ragMap.ready", timeout=300_000)
    page.wait_for_timeout(500)
    shot = out / "map.png"
    page.screenshot(path=str(shot))
    page.close()
    print(f"wrote {shot} ({_small_png(shot) / 1000:.0f} KB)", flush=True)
    return shot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--store",
        type=Path,
        help="an existing store (default: build one from corpus/ in a temp dir)",
    )
    parser.add_argument("--runs", type=int, default=5, help="questions per mode (median reported)")
    parser.add_argument("--no-llm-server", action="store_true", help="extractive mode only")
    parser.add_argument(
        "--max-tokens", type=int, default=128, help="RAG_LLM_MAX_TOKENS for the LLM mode"
    )
    parser.add_argument(
        "--context-tokens", type=int, default=1000, help="RAG_LLM_CONTEXT_TOKENS for the LLM mode"
    )
    parser.add_argument(
        "--screenshot",
        type=Path,
        default=REPO / "bench/results/ui_answer_llm.png",
        help="screenshot of the last LLM answer (extractive: *_extractive.png)",
    )
    parser.add_argument("--json", type=Path, help="write the figures and samples here")
    parser.add_argument(
        "--screenshots",
        type=Path,
        metavar="DIR",
        help="write the docs' screenshots of the chat and the map to DIR (measures nothing)",
    )
    parser.add_argument(
        "--map-store",
        type=Path,
        metavar="DIR",
        help="with --screenshots: also DIR/map.png, the `rag map --ask` page of this store",
    )
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from rag import RAG

    tmp = None
    store = args.store
    if store is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-ui-")
        store = Path(tmp.name) / "store"
        t0 = time.perf_counter()
        RAG(store_dir=store, llm="none").ingest()
        print(f"built the seed store in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.screenshots is not None:
        if tmp is None:  # a copy: the map caches its layout in the store
            import shutil

            tmp = tempfile.TemporaryDirectory(prefix="bench-ui-")
            store = Path(shutil.copytree(store, Path(tmp.name) / "store"))
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=CHROMIUM,
                    args=[
                        "--no-sandbox",
                        "--disable-background-networking",
                        "--disable-component-update",
                        *WEBGL_ARGS,
                    ],
                )
                take_screenshots(browser, store, args.screenshots)
                if args.map_store is not None:
                    import shutil

                    map_store = Path(shutil.copytree(args.map_store, Path(tmp.name) / "map-store"))
                    map_screenshot(browser, map_store, args.screenshots)
                browser.close()
        finally:
            tmp.cleanup()
        return 0
    results: dict = {"store": str(store), "questions": QUESTIONS[: args.runs]}
    server = None
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--no-sandbox",
                    "--disable-background-networking",
                    "--disable-component-update",
                ],
            )
            shot = args.screenshot.with_name(
                args.screenshot.stem.replace("_llm", "") + "_extractive.png"
            )
            results["extractive"] = run_mode(
                "extractive", RAG(store_dir=store, llm="none"), browser, args.runs, shot
            )
            if not args.no_llm_server:
                from tests.harness import start_llama_server

                server = start_llama_server(n_threads=1, n_threads_batch=1)
                rag = RAG(
                    store_dir=store,
                    openai_base_url=server.base_url,
                    llm_model=server.model,
                    llm_max_tokens=args.max_tokens,
                    llm_context_tokens=args.context_tokens,
                )
                results["llm"] = run_mode(
                    f"llm ({server.model}, max_tokens {args.max_tokens}, "
                    f"context {args.context_tokens})",
                    rag,
                    browser,
                    args.runs,
                    args.screenshot,
                )
                results["llm"]["settings"] = {
                    "model": server.model,
                    "max_tokens": args.max_tokens,
                    "context_tokens": args.context_tokens,
                    "n_threads": 1,
                }
            browser.close()
    finally:
        if server is not None:
            server.stop()
        if tmp is not None:
            tmp.cleanup()

    print(
        f"\nmedian of {args.runs} runs, ms (UI: in the browser; direct: RAG.stream without the UI);"
        f" {machine_load()}"
    )
    print(
        "| mode | page ready | page load event | Enter -> answer bubble | Enter -> first char "
        "| Enter -> complete | direct first char | direct complete |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in ("extractive", "llm"):
        r = results.get(mode)
        if r:
            print(
                f"| {mode} | {r['page_ready_ms']:.0f} | {r['page_load_event_ms']:.0f} |"
                f" {r['bubble_ms']:.0f} | {r['first_char_ms']:.0f} | {r['complete_ms']:.0f} |"
                f" {r['direct_first_char_ms']:.0f} | {r['direct_complete_ms']:.0f} |"
            )
    print(f"screenshots: {shot}" + (f", {args.screenshot}" if "llm" in results else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
