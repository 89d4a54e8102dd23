"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright (never
`playwright install`), cut off from the network's services, with software WebGL for the map.

The `browser` fixture (tests/conftest.py) is one such browser per test module, shared by the
module's tests that drive a page; `chromium()` launches another (a test that needs its own flags or
its own process). Both come from one Playwright driver, started when the first browser opens and
stopped when the last one closes: Playwright's sync API refuses a second driver in the same thread
while one runs, and while a driver runs it holds an asyncio loop running in this thread, so any
later test in the process that calls `asyncio.run` (the MCP client, anyio) fails with "cannot be
called from a running event loop" (17 tests did, when the driver lived for the whole session). Tests
that use either are skipped, with the reason, only where chromium or playwright is missing and CI is
not set (`needs_browser`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - reported by the skip below
    sync_playwright = None

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).parent / "artifacts"  # screenshots, for a person to look at
ARGS = ("--no-sandbox", "--disable-background-networking", "--disable-component-update")
# --enable-unsafe-swiftshader: Chromium is dropping the automatic fallback to software WebGL; with
# it a machine without a GPU still gets a WebGL context. --use-angle=swiftshader picks that backend
# outright.
WEBGL_ARGS = ("--enable-unsafe-swiftshader", "--use-angle=swiftshader")

_missing = [
    what
    for what, ok in (
        ("/usr/bin/chromium", os.path.exists(CHROMIUM)),
        ("the playwright package", sync_playwright is not None),
    )
    if not ok
]
needs_browser = pytest.mark.skipif(
    bool(_missing) and not os.environ.get("CI"),
    reason=(
        f"browser test needs {' and '.join(_missing)} (apt-get install -y chromium; pip install"
        " playwright)"
    ),
)

_driver: Any = None  # the Playwright driver while any browser is open
_open = 0  # browsers open on it


@contextlib.contextmanager
def chromium(*extra_args: str) -> Iterator[Any]:
    """A new headless Chromium with the base flags and `extra_args`, closed on leaving the `with`
    (and the driver with the last open browser)."""
    global _driver, _open
    if sync_playwright is None:
        pytest.fail("playwright is not installed (pip install playwright)")
    ARTIFACTS.mkdir(exist_ok=True)
    if _driver is None:
        _driver = sync_playwright().start()
    _open += 1
    try:
        b = _driver.chromium.launch(executable_path=CHROMIUM, args=[*ARGS, *extra_args])
        try:
            yield b
        finally:
            b.close()
    finally:
        _open -= 1
        if _open == 0:
            _driver.stop()
            _driver = None
