"""Citation markers as text: the `[n]` grammar, quotes' escaped brackets, the references block.

The answer layer writes and checks markers (rag/answer/citations.py); the surfaces show them (the
CLI, the chat, the HTTP API): both read them here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rag.models import Answer

# A bracket written as "\[" is text, not a marker: quotes escape their brackets (`escape_quote`).
# "[3]", "[1, 2]", "[2-4]", "[Source 2]".
MARKER = re.compile(
    r"(?<!\\)\[\s*(?:(?i:source|src|ref|doc)\s*)?"
    r"(\d+(?:\s*(?:[,;]|-|–)\s*\d+)*)\s*\]"
)
_ESCAPED = re.compile(r"\\([\\\[\]])")


def marker_numbers(group: str) -> list[int]:
    """The numbers inside one marker: "1, 3" is [1, 3]; a short range "2-4" is [2, 3, 4]."""
    out: list[int] = []
    for part in re.split(r"\s*[,;]\s*", group.strip()):
        if re.fullmatch(r"\d+\s*[-–]\s*\d+", part):
            lo, hi = (int(x) for x in re.split(r"\s*[-–]\s*", part))
            if 0 < hi - lo < 20:
                out.extend(range(lo, hi + 1))
                continue
        out.extend(int(x) for x in re.findall(r"\d+", part))
    return out


def parse_markers(text: str) -> list[int]:
    """Every cited number, in order of appearance (repeats kept)."""
    return [n for m in MARKER.finditer(text) for n in marker_numbers(m.group(1))]


def escape_quote(text: str) -> str:
    """Quoted document text whose brackets stay text: "W[1]-hard" is no citation of source 1."""
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def plain_text(text: str) -> str:
    """Answer text as a reader sees it: escaped brackets of quotes shown as brackets."""
    return _ESCAPED.sub(r"\1", text)


def reference_lines(answer: Answer) -> list[str]:
    """The answer's references as text lines: "[n] Title — url" for each cited source (flagged
    when its passage does not support it), then the other sources, nearest first. For text-only
    readers (the CLI, a LlamaIndex tool's response) that cannot see `Answer.sources`."""
    from rag.latex import plain_prose

    unsupported = {c.n for c in answer.citations if c.supported is False}
    cited = [s for s in answer.sources if s.cited]
    others = [s for s in answer.sources if not s.cited]
    lines = []
    if cited:
        lines.append("References:")
        lines += [
            f"[{s.n}] {plain_prose(s.title)}"
            + (f" — {s.url}" if s.url else "")
            + ("  (not supported by this passage)" if s.n in unsupported else "")
            for s in cited
        ]
    if others:
        lines.append("Also retrieved:" if cited else "Nearest papers:")
        lines += [f"    {plain_prose(s.title)}" + (f" — {s.url}" if s.url else "") for s in others]
    return lines
