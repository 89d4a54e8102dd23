"""Which of the chat page's CSP relaxations could hashes replace? Measured in headless Chromium
(Debian's).

    python -m bench.serving.ui_csp [--store DIR]

Serves the real chat (`rag.ui.app.launch`, extractive, on a copy of the store: default the 76 seed
papers) and prints, first, the inline scripts of the page as Gradio serves it (GET /, from 127.0.0.1
and from localhost) with their sha256: whether a hash computed once could pin them. Then, for each
candidate policy, it rewrites the Content-Security-Policy header of every document the browser loads
(the chat and the /map frame; Playwright routing, the app is untouched), asks one question, and
prints:
- whether the chat rendered, whether the answer's sources panel was drawn (a gr.HTML), whether the
  map beside it became ready and lit up the answer's papers (that needs the head bridge script,
  ui/static/map_bridge.js, which Gradio re-creates as an inline script);
- whether an inline event handler injected into the page ran (`<img onerror>`: what markup slipping
  past the escaping would carry; 'unsafe-inline' allows it, a hash-only script-src does not);
- the CSP violations the chat page and the map frame reported (directive: count and samples). The
  numbers it prints are seconds per candidate, with the machine's load (a busy machine is slower).
  Playwright's waits evaluate strings in the page, which a policy without 'unsafe-eval' blocks too:
  under that candidate only "chat rendered" and what the sources panel says are meaningful.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import shutil
import tempfile
import time
from pathlib import Path

from bench.helpers import REPO, machine_load

CHROMIUM = "/usr/bin/chromium"
QUESTION = "How does Palimpsa relate to Mamba2?"
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)([^>]*)>(.*?)</script>", re.S | re.I)
RECORD = """window.__violations = [];
document.addEventListener("securitypolicyviolation", e => window.__violations.push(
  [e.effectiveDirective, e.blockedURI, (e.sample || "").slice(0, 50)]));"""
INJECT = """() => new Promise(done => {
  document.querySelector('#sources').insertAdjacentHTML('beforeend', '<img src="data:," onerror="window.__pwned = 1">');
  setTimeout(() => done(window.__pwned === 1), 500);
})"""


def sha_source(text: str) -> str:
    return (
        "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"
    )


def executable_scripts(page: str) -> list[str]:
    """The text of each inline script a browser would run (not a data block such as
    application/json)."""
    return [text for attrs, text in INLINE_SCRIPT.findall(page) if "application/json" not in attrs]


def with_sources(policy: str, script_src: str, style_src: str) -> str:
    """`policy` with its script-src and style-src replaced ('report-sample' added: violations show
    the text)."""
    rest = [d for d in policy.split("; ") if not d.startswith(("script-src", "style-src"))]
    return "; ".join(
        [
            f"script-src {script_src} 'report-sample'",
            f"style-src {style_src} 'report-sample'",
            *rest,
        ]
    )


def try_policy(browser, url: str, policy: str) -> dict:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    context.set_default_timeout(60_000)
    # init scripts run in every frame, before the page's own, outside its CSP
    context.add_init_script(RECORD)

    def rewrite(route):
        # a document's own policy is the one that applies to it
        if route.request.resource_type != "document":
            return route.continue_()
        response = route.fetch()
        headers = {
            k: v for k, v in response.headers.items() if k.lower() != "content-security-policy"
        }
        route.fulfill(response=response, headers={**headers, "content-security-policy": policy})

    context.route("**/*", rewrite)
    page = context.new_page()
    page.goto(url)
    out: dict = {}
    try:
        page.locator("#question textarea").wait_for(timeout=30_000)
        out["chat rendered"] = True
    except Exception:  # the candidate broke the page: say so and go on to the next
        out["chat rendered"] = False
    frame = None
    if out["chat rendered"]:
        page.get_by_role("tab", name="Map").click()
        page.locator("#question textarea").fill(QUESTION)
        page.locator("#question textarea").press("Enter")
        try:
            page.wait_for_function(
                "document.querySelectorAll('#sources .src-card').length > 0", timeout=90_000
            )
            out["sources panel drawn"] = True
        except Exception:
            out["sources panel drawn"] = False
            out["sources panel says"] = page.locator("#sources").inner_text()[:100]
        out["map ready"] = False
        for _ in range(300):  # /map says "laying out" and reloads itself until the layout is done
            frame = page.frame(url=re.compile(r"/map$"))
            try:
                if frame is not None and frame.evaluate("!!(window.ragMap && window.ragMap.ready)"):
                    out["map ready"] = True
                    break
            except Exception:  # the frame navigated (its reload) while being asked
                pass
            page.wait_for_timeout(200)
        try:
            frame.wait_for_function("window.ragMap.highlighted().cited.length > 0", timeout=20_000)
            out["map lit up (bridge ran)"] = True
        except Exception:
            out["map lit up (bridge ran)"] = False
        out["injected onerror ran"] = page.evaluate(INJECT)
    for name, where in (("violations (chat)", page), ("violations (map)", frame)):
        try:
            found = where.evaluate("window.__violations") if where is not None else []
        except Exception:
            found = ["(frame gone)"]
        kinds: dict[str, list[str]] = {}
        for directive, blocked, sample in found:
            kinds.setdefault(directive, []).append(f"{blocked}: {sample}")
        out[name] = {k: [len(v), sorted(set(v))[:5]] for k, v in kinds.items()}
    context.unroute_all(behavior="ignoreErrors")
    context.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--store",
        type=Path,
        default=REPO.parent / "stores" / "seeds",
        help="a store to copy and serve (default: ../stores/seeds, the 76 seed papers)",
    )
    args = parser.parse_args()

    import httpx
    from playwright.sync_api import sync_playwright

    from rag import RAG
    from rag.paper_map.page import render_map_html
    from rag.ui.app import launch
    from rag.ui.map_view import HEAD_SCRIPT
    from rag.ui.security import CSP
    from tests.harness import free_port

    print(machine_load())
    tmp = Path(tempfile.mkdtemp(prefix="bench-ui-csp-"))
    store = shutil.copytree(args.store, tmp / "store")
    port = free_port()
    demo = launch(RAG(store_dir=store, llm="none"), port=port, block=False)
    url = f"http://127.0.0.1:{port}/"
    try:
        served = {
            host: executable_scripts(httpx.get(f"http://{host}:{port}/", trust_env=False).text)
            for host in ("127.0.0.1", "localhost")
        }
        again = executable_scripts(httpx.get(url, trust_env=False).text)
        print(
            f"GET / holds {len(served['127.0.0.1'])} inline scripts; the same text on a second GET:"
            f" {again == served['127.0.0.1']}; the same from localhost:"
            f" {served['localhost'] == served['127.0.0.1']}"
        )
        for text, other in zip(served["127.0.0.1"], served["localhost"]):
            print(
                f"  {sha_source(text)} {len(text):>7} chars"
                f" {'same' if text == other else 'DIFFERS'} by host  {text.strip()[:48]!r}"
            )
        page_hashes = " ".join(sha_source(t) for t in served["127.0.0.1"])
        # The head bridge, as Gradio re-creates it from the config; the map's script (the /map frame
        # gets this header too).
        bridge = sha_source(executable_scripts(HEAD_SCRIPT)[0])
        map_script = sha_source(executable_scripts(render_map_html({"papers": {"ids": []}}))[0])
        hashed = f"'self' 'unsafe-eval' {page_hashes} {bridge} {map_script}"
        candidates = [
            ("shipped", CSP),
            (
                "script-src without 'unsafe-inline', no hashes",
                with_sources(CSP, "'self' 'unsafe-eval'", "'self' 'unsafe-inline'"),
            ),
            (
                "script-src: hashes of GET /, the bridge and the map",
                with_sources(CSP, hashed, "'self' 'unsafe-inline'"),
            ),
            (
                "script-src: those hashes, without 'unsafe-eval'",
                with_sources(CSP, hashed.replace(" 'unsafe-eval'", ""), "'self' 'unsafe-inline'"),
            ),
            (
                "script-src hashed, style-src without 'unsafe-inline'",
                with_sources(CSP, hashed, "'self'"),
            ),
        ]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    "--no-sandbox",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--enable-unsafe-swiftshader",
                    "--use-angle=swiftshader",
                ],
            )
            for name, policy in candidates:
                start = time.perf_counter()
                result = try_policy(browser, url, policy)
                print(f"\n== {name} ({time.perf_counter() - start:.0f} s, {machine_load()})")
                print(json.dumps(result, indent=1, ensure_ascii=False))
            browser.close()
    finally:
        demo.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
