"""The map beside the chat: the page at /map (the same page as `rag map --out`), laid out once in
the background, and the glue that lights up the papers of the answer shown.

`MapPages` builds the page on a thread at launch (a large layout takes minutes); until then /map
says so and reloads itself, and after an ingest the next request rebuilds it. The chat page and the
map (a same-origin iframe) talk with postMessage, origins and frames checked on both sides.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import os
import threading
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rag import RAG
    from rag.models import Source

log = logging.getLogger(__name__)
MAP_PATH = "/map"
PENDING_REFRESH_S = 3
LAYOUT_NICENESS = 10
FRAME = (
    f'<iframe id="map-frame" src="{MAP_PATH}" title="Map of the indexed papers" loading="lazy" '
    # as tall as the window leaves below the tabs: the whole map on the first screen, never cut
    # off
    'style="width:100%;height:calc(100vh -'
    ' 150px);min-height:360px;border:0;border-radius:8px"></iframe>'
)
# In the chat page's <head> (static/map_bridge.js): the sources panel of the answer shown carries
# that answer's papers (data-map on .src-panel); whenever the panel changes, the map gets them. The
# map, once ready, asks for them too (it may load after the answer).
BRIDGE_JS = (resources.files("rag.ui") / "static" / "map_bridge.js").read_text(encoding="utf-8")
# And static/cites.js: a citation [n] in the chat shows its paper's card in the Sources panel. One
# script element for both (the page's CSP notes count them: ui/security.py).
CITES_JS = (resources.files("rag.ui") / "static" / "cites.js").read_text(encoding="utf-8")
HEAD_SCRIPT = f"<script>\n{BRIDGE_JS}\n{CITES_JS}</script>"


def map_attribute(sources: list[Source], question: str | None) -> str:
    """The data-map attribute of a sources panel: its answer's papers as the map lights them."""
    from rag import RAG

    data = {**RAG.map_highlight(sources), "question": question or ""}
    return f' data-map="{html.escape(json.dumps(data))}"'


class MapPages:
    """The /map page of one engine, built in the background and rebuilt when the store grows."""

    def __init__(self, rag: RAG) -> None:
        self.rag = rag
        self._lock = threading.Lock()
        self._page: bytes | None = None
        self._built_for: int | None = None  # the store's last chunk rowid the page shows
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Lay out the map now, on a thread: the first visit to the map should not wait for it."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._build, name="rag-map", daemon=True)
                self._thread.start()

    def page(self) -> tuple[int, bytes]:
        """(status, HTML) for GET /map: the map, or a page saying it is being laid out."""
        stale = self._built_for is not None and self._built_for != self.rag.store.last_rowid()
        if self._page is None or stale:
            self.start()
        if self._page is not None:
            return 200, self._page  # a stale page is still shown while the new one is built
        if self._error:
            return 503, _notice(f"The map could not be laid out: {self._error}", refresh=False)
        return 200, _notice(
            "Laying out the map of the indexed papers… (once per store; a minute or more for "
            "tens of thousands of papers)",
            refresh=True,
        )

    def _build(self) -> None:
        from rag.errors import RagError

        with contextlib.suppress(AttributeError, OSError):
            # Linux nices one thread by its id, and the layout's worker threads inherit it:
            # questions asked meanwhile keep the CPU (a 100k-paper layout takes minutes of both
            # cores).
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LAYOUT_NICENESS)
        try:
            last = self.rag.store.last_rowid()
            page = self.rag.map_page().encode()
        except RagError as exc:
            self._error = str(exc)
            return
        except Exception as exc:  # a bug must not leave the page saying "laying out" forever
            log.exception("map layout failed")
            self._error = f"{type(exc).__name__}: {exc}"
            return
        self._page, self._built_for, self._error = page, last, None


def _notice(text: str, refresh: bool) -> bytes:
    meta = f'<meta http-equiv="refresh" content="{PENDING_REFRESH_S}">' if refresh else ""
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{meta}<title>Map</title></head>'
        f'<body style="font-family:system-ui,sans-serif;color:#444;padding:2em">'
        f'<p id="map-pending">{html.escape(text)}</p></body></html>'
    ).encode()
