"""Citation markers as data: parse `[n]`, `[1, 2]`, `[1-3]`, `[1][2]`; drop markers that map to no
source; renumber cited sources 1..m in order of first use; check each citation's support."""

from __future__ import annotations

import re

from .keyword import tokenize
from .models import Citation, Source

MARKER = re.compile(r"\[\s*(\d+(?:\s*(?:[,;]|-|–)\s*\d+)*)\s*\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\[(])")


def _numbers(group: str) -> list[int]:
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
    return [n for m in MARKER.finditer(text) for n in _numbers(m.group(1))]


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def supports(sentence: str, passage: str, threshold: float = 0.3) -> bool:
    """Lexical support: enough of the sentence's content words occur in the passage."""
    claim = set(tokenize(MARKER.sub(" ", sentence)))
    if not claim:
        return True
    return len(claim & set(tokenize(passage))) / len(claim) >= threshold


def renumber(text: str, sources: list[Source]) -> tuple[str, list[Citation], list[Source], list[int]]:
    """Map the model's numbers (1-based positions in `sources`) to final numbers.

    Returns the rewritten text, the citations, the renumbered sources (cited first, in order of
    first use, then the uncited) and the invalid numbers that were removed.
    """
    order: list[int] = []
    invalid: list[int] = []
    for n in parse_markers(text):
        if 1 <= n <= len(sources):
            if n not in order:
                order.append(n)
        elif n not in invalid:
            invalid.append(n)
    new_number = {old: i + 1 for i, old in enumerate(order)}

    def rewrite(m: re.Match) -> str:
        nums = []
        for n in _numbers(m.group(1)):
            if n in new_number and new_number[n] not in nums:
                nums.append(new_number[n])
        return "".join(f"[{n}]" for n in nums)

    new_text = MARKER.sub(rewrite, text)
    new_text = re.sub(r"[ \t]+([.,;:])", r"\1", new_text)
    new_text = re.sub(r"[ \t]{2,}", " ", new_text).strip()
    renumbered: list[Source] = []
    for old in order:
        renumbered.append(sources[old - 1].model_copy(update={"n": new_number[old], "cited": True}))
    rest = [s for i, s in enumerate(sources, 1) if i not in new_number]
    for j, s in enumerate(rest):
        renumbered.append(s.model_copy(update={"n": len(order) + j + 1, "cited": False}))
    by_n = {s.n: s for s in renumbered}
    citations = []
    for sentence in split_sentences(new_text):
        for n in parse_markers(sentence):
            if n in by_n:
                citations.append(Citation(n=n, paper_id=by_n[n].paper_id,
                                          supported=supports(sentence, by_n[n].passage)))
    return new_text, _merge(citations), renumbered, invalid


def _merge(citations: list[Citation]) -> list[Citation]:
    """One citation per marker number: supported if any sentence citing it is supported."""
    merged: dict[int, Citation] = {}
    for c in citations:
        if c.n not in merged:
            merged[c.n] = c
        elif c.supported:
            merged[c.n] = merged[c.n].model_copy(update={"supported": True})
    return [merged[n] for n in sorted(merged)]


def grounding(citations: list[Citation]) -> float | None:
    checked = [c for c in citations if c.supported is not None]
    return round(sum(c.supported for c in checked) / len(checked), 3) if checked else None
