"""The map page: every paper as a point on a WebGL canvas, with search, paper cards and an answer's
papers.

`render_map_html(data)` returns one self-contained HTML document: the files in static/ inlined, the
data as JSON, and a CSP that lets the page load nothing and run only its own script and style
(pinned by sha256). Every string of the data is untrusted and reaches the DOM only as text. What the
page shows, and the messages it takes from a parent frame: docs/ui.md.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import math
import re
from importlib import resources
from typing import Any

_TEXT_COLUMNS = ("ids", "titles", "authors", "years", "venues", "urls")
# Inside the JSON: "<" ">" "&" could close the data's <script> element or open a comment in it;
# U+2028/9 break older JS parsers; a lone surrogate cannot be encoded as UTF-8 at all. As \u escapes
# they are inert.
_UNSAFE_IN_SCRIPT = re.compile("[<>&\u2028\u2029\ud800-\udfff]")

STATIC = "static"  # the page's files, next to this module (package data in the wheel)


@functools.cache
def _page() -> str:
    """static/map.html with map.css and map.js inlined, and the CSP pinning each by its sha256 (read
    once).

    The hashes are of the exact text of the page's <style> and executable <script> elements, so the
    page runs its own script and style and nothing else: no 'unsafe-inline'. The data's <script
    type="application/json"> is never executed, so it needs no hash (and may change with every
    page)."""
    files = resources.files("rag.paper_map") / STATIC
    template, css, js = (
        (files / name).read_text(encoding="utf-8") for name in ("map.html", "map.css", "map.js")
    )
    values = {"CSS": css, "JS": js}
    values["CSS_SHA256"] = _sha256(
        _element_text(template, "<style>", "</style>").replace("@@CSS@@", css)
    )
    values["JS_SHA256"] = _sha256(
        _element_text(template, "<script>", "</script>").replace("@@JS@@", js)
    )
    # One pass, as in render_map_html; @@TITLE@@ and @@DATA@@ are left for it.
    return re.sub("@@([A-Z0-9_]+)@@", lambda m: values.get(m.group(1), m.group()), template)


def _element_text(template: str, start: str, end: str) -> str:
    """The text between the first `start` tag and the `end` tag after it: the element's text as a
    browser hashes it."""
    i = template.index(start) + len(start)
    return template[i : template.index(end, i)]


def _sha256(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _coord(value: Any) -> float:
    v = float(value)
    return round(v, 4) if math.isfinite(v) else 0.0


def _column(papers: dict, key: str, n: int) -> list:
    values = papers.get(key)
    if values is None:
        return [None] * n
    if len(values) != n:
        raise ValueError(f"papers[{key!r}] has {len(values)} entries, papers['ids'] has {n}")
    return list(values)


def _payload(data: dict) -> dict:
    papers = data.get("papers") or {}
    ids = papers.get("ids")
    n = 0 if ids is None else len(ids)  # not `or []`: columns may be numpy arrays
    out: dict[str, Any] = {k: [_text(v) for v in _column(papers, k, n)] for k in _TEXT_COLUMNS}
    abstracts = papers.get("abstracts")
    out["abstracts"] = (
        None if abstracts is None else [_text(v) for v in _column(papers, "abstracts", n)]
    )
    out["x"] = [_coord(v) for v in _column(papers, "x", n)]
    out["y"] = [_coord(v) for v in _column(papers, "y", n)]
    out["cluster"] = [-1 if c is None else int(c) for c in _column(papers, "cluster", n)]
    clusters = [
        {
            "label": _text(c.get("label")),
            "x": _coord(c.get("x") or 0),
            "y": _coord(c.get("y") or 0),
            "size": int(c.get("size") or 0),
        }
        for c in data.get("clusters") or []
    ]
    payload: dict[str, Any] = {
        "title": _text(data.get("title")) or f"Map of {n:,} papers",
        "papers": out,
        "clusters": clusters,
    }
    highlight = data.get("highlight")
    if highlight:
        payload["highlight"] = {
            k: [_text(i) for i in highlight.get(k) or []] for k in ("cited", "retrieved")
        }
    if data.get("question"):
        payload["question"] = _text(data["question"])
    return payload


def render_map_html(data: dict) -> str:
    """The map page: one self-contained HTML document (inline CSS and JS, nothing remote).

    `data`: {"title": str, "papers": {"ids", "titles", "authors", "years", "venues", "urls": [str],
    "abstracts": [str] or None, "x", "y": [float], "cluster": [int, -1 for none]}, "clusters":
    [{"label", "x", "y", "size"}], "highlight": {"cited": [id], "retrieved": [id]} (optional),
    "question": str (optional)}. The paper arrays are parallel (another length raises ValueError);
    coordinates are rounded to 4 decimals, which keeps a 100k-paper page near its text's size.
    """
    payload = _payload(data)
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    blob = _UNSAFE_IN_SCRIPT.sub(lambda m: f"\\u{ord(m.group()):04x}", blob)
    values = {"TITLE": html.escape(payload["title"]), "DATA": blob}
    # One pass, so a title holding "@@DATA@@" is never substituted in turn.
    return re.sub("@@(TITLE|DATA)@@", lambda m: values[m.group(1)], _page())
