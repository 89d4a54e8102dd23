"""Citation markers as data.

Parse `[n]`, `[1, 2]`, `[1-3]`, `[1][2]`, `[Source 2]`; drop markers that map to no source;
renumber cited sources 1..m in order of first use (also while the answer streams, so what a
reader sees live is what the final answer says); check each cited sentence against the passage
it cites and flag sentences that cite nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The markers' grammar is shared with the surfaces (rag/markers.py); escape_quote, plain_text and
# reference_lines are re-exported for the answer layer, the tests and bench, which import them here.
from rag.markers import MARKER, marker_numbers, parse_markers
from rag.markers import escape_quote as escape_quote
from rag.markers import plain_text as plain_text
from rag.markers import reference_lines as reference_lines
from rag.models import Citation, Source
from rag.text import keyword_terms
from rag.text import split_sentences as _prose_sentences

_MARKER_RUN = rf"(?:\s*{MARKER.pattern})+"
# Markers written after a sentence's period belong to that sentence: "... problem.[1] Next ..."
_AFTER_PERIOD_MARKERS = re.compile(rf"(?<=[.!?]){_MARKER_RUN}(?=\s+\S|\s*$)")
_LEADING_MARKERS = re.compile(rf"^{_MARKER_RUN}")
# Markup that closes after a sentence's end ("... line.** For", "... it.}$ We"): the prose rules
# see no end there, and a planted sentence in bold ran on into the content sentence after it.
_AFTER_PERIOD_MARKUP = re.compile(r"(?<=[.!?])[*_}$]{1,6}(?=\s+[A-Z])")
_BEFORE_MARKUP = re.compile(r"(?<=[.!?])(?=\s+(?:[>*_]\s*){1,6}[A-Z])")  # "... end. > **Dear"
# The full stops of other scripts (CJK, Devanagari, Arabic, Urdu): a sentence in Hindi ran on into
# the English one after it, and was no longer in another script.
_OTHER_STOPS = re.compile(r"(?<=[。！？।॥؟۔])")
_MAX_MARKER_CHARS = 60  # an unclosed "[" with this much text after it is text, not a marker
_MARKER_PREFIX = re.compile(r"[\[\]\s\d,;\-–]*|\[+\s*[A-Za-z]{0,6}\s*[\d\s,;\-–\[\]]*")


def _hold_from(text: str) -> int:
    """Where the text that may still become a marker starts (len(text) when nothing is pending)."""
    opened: list[int] = []
    for i, ch in enumerate(text):
        if ch == "[":
            opened.append(i)
        elif ch == "]" and opened:
            opened.pop()
    # The first unclosed bracket that may still open a marker: one too far back to be a marker's is
    # text, but a later one may be ("[[[[ ... finding.[2, 1" streamed in two pieces showed "[2, 1]"
    # that the whole text drops).
    for start in opened:
        tail = text[start:]
        if len(tail) <= _MAX_MARKER_CHARS or (len(tail) <= 200 and _MARKER_PREFIX.fullmatch(tail)):
            return start
    return len(text)


def split_sentences(text: str) -> list[str]:
    """Sentences of an answer or a passage: its lines, cut by the chunker's sentence rules (which
    keep "e.g." and "et al." inside a sentence). Markers written after a period ("... problem. [1]
    Next") stay with the sentence they follow, as a reader takes them."""
    out: list[str] = []
    for line in text.splitlines():
        # A cut after the markers that follow a period, which the prose rules do not see as an end.
        line = _AFTER_PERIOD_MARKERS.sub(lambda m: m.group() + "\n", line)
        line = _AFTER_PERIOD_MARKUP.sub(lambda m: m.group() + "\n", line)
        line = _BEFORE_MARKUP.sub("\n", line)
        line = _OTHER_STOPS.sub("\n", line)
        for part in line.split("\n"):
            for sentence in _prose_sentences(part):
                sentence = sentence.strip()
                lead = _LEADING_MARKERS.match(sentence)
                if lead and out:
                    out[-1] = f"{out[-1]} {lead.group().strip()}"
                    sentence = sentence[lead.end() :].strip()
                if sentence:
                    out.append(sentence)
    return out


@dataclass
class MarkerRewriter:
    """Renumbers markers in text that arrives in pieces.

    Numbers are the model's (1-based positions in the prompt's sources); each valid number gets
    the next final number at its first use; invalid ones are dropped (with the space before them).
    """

    n_sources: int
    order: list[int] = field(default_factory=list)  # model numbers in order of first use
    invalid: list[int] = field(default_factory=list)
    _pending: str = ""

    def _rewrite(self, m: re.Match) -> str:
        nums: list[int] = []
        for n in marker_numbers(m.group(1)):
            if 1 <= n <= self.n_sources:
                if n not in self.order:
                    self.order.append(n)
                new = self.order.index(n) + 1
                if new not in nums:
                    nums.append(new)
            elif n not in self.invalid:
                self.invalid.append(n)
        return "".join(f"[{n}]" for n in nums)

    def _convert(self, text: str) -> str:
        out, last = [], 0
        for m in MARKER.finditer(text):
            before, replacement = text[last : m.start()], self._rewrite(m)
            if not replacement:  # a dropped marker takes the space before it...
                before = before.rstrip(" \t")
                # ...and must not leave brackets that join into a new marker
                if before.endswith("["):
                    before = before[:-1] + "("
            out += [before, replacement]
            last = m.end()
        out.append(text[last:])
        return "".join(out)

    def feed(self, piece: str) -> str:
        """Text safe to show now; a possibly unfinished marker (and the space before it) is held."""
        text = self._pending + piece
        cut = _hold_from(text)
        # "\[1]" is an escaped bracket, not a marker: wait for what follows
        if cut > 0 and text[cut - 1] == "\\":
            cut -= 1
        while cut > 0 and text[cut - 1] in " \t":
            cut -= 1
        self._pending = text[cut:]
        return self._convert(text[:cut])

    def close(self) -> str:
        text, self._pending = self._pending, ""
        return self._convert(text)


def renumber_sources(sources: list[Source], order: list[int]) -> list[Source]:
    """Cited sources first, numbered in `order` (their old numbers in order of first use), then the
    rest."""
    new_number = {old: i + 1 for i, old in enumerate(order)}
    cited = [
        sources[old - 1].model_copy(update={"n": new, "cited": True})
        for old, new in new_number.items()
    ]
    rest = [s for i, s in enumerate(sources, 1) if i not in new_number]
    return cited + [
        s.model_copy(update={"n": len(cited) + j + 1, "cited": False}) for j, s in enumerate(rest)
    ]


def renumber(text: str, sources: list[Source]) -> tuple[str, list[Source], list[int]]:
    """Rewrite a whole answer: (text, renumbered sources, invalid numbers removed)."""
    rewriter = MarkerRewriter(len(sources))
    new_text = rewriter.feed(text) + rewriter.close()
    return new_text.strip(), renumber_sources(sources, rewriter.order), rewriter.invalid


# ---- support ---------------------------------------------------------------------------------

LEXICAL_SUPPORT = 0.6  # share of the claim's content words found in the passage
SEMANTIC_SUPPORT = 0.6  # cosine between the claim and the passage's closest sentence
MIXED_LEXICAL, MIXED_SEMANTIC = 0.3, 0.5


def lexical_overlap(sentence: str, passage: str) -> float:
    claim = set(keyword_terms(MARKER.sub(" ", sentence)))
    if not claim:
        return 1.0
    return len(claim & set(keyword_terms(passage))) / len(claim)


_WORD = re.compile(r"[A-Za-z0-9][\w\-.+%/]*")
# A count written as a word ("three arenas") must be the passage's too, as a word or in digits.
_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
    if i >= 2
} | {
    "thirty": "30",
    "forty": "40",
    "fifty": "50",
    "hundred": "100",
    "thousand": "1000",
    "million": "1000000",
    "billion": "1000000000",
    "dozen": "12",
}
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def novel_terms(sentence: str, passage: str) -> list[str]:
    """Numbers and names in the claim that its passage never writes: "fine-tuned from Llama-3-8B" or
    "10% more often" where the abstract says 50%. A small model's slips are mostly these, in a
    sentence whose other words all come from the passage. Names are words with a digit or a capital
    letter after their first character, or capitalised words past the sentence's first; they are
    compared without case or punctuation ("2,000" is "2{,}000"). A count written as a word ("three
    arenas") counts too, unless the passage writes it, as a word or in digits."""
    text = _NOT_ALNUM.sub("", passage.lower())
    passage_words = set(re.findall(r"[a-z]+", passage.lower()))
    out = [
        w
        for w in re.findall(r"[A-Za-z]+", MARKER.sub(" ", sentence))
        if w.lower() in _NUMBER_WORDS
        and w.lower() not in passage_words
        and not re.search(rf"(?<![\d.]){_NUMBER_WORDS[w.lower()]}(?![\d.])", passage)
    ]
    for i, m in enumerate(_WORD.finditer(MARKER.sub(" ", sentence))):
        word = m.group().rstrip(".")
        specific = (
            any(c.isdigit() for c in word)
            or any(c.isupper() for c in word[1:])
            or (i > 0 and word[:1].isupper())
        )
        key = _NOT_ALNUM.sub("", word.lower())
        if specific and len(key) >= 2 and key not in text and key.rstrip("s") not in text:
            out.append(word)
    return out


def is_claim(sentence: str) -> bool:
    """Sentences that state something (not a heading, a list marker or a one-word reply)."""
    return len(keyword_terms(MARKER.sub(" ", sentence))) >= 3


@dataclass
class SupportReport:
    citations: list[Citation]
    grounding: float | None
    uncited: list[str]
    # source n -> its passage sentences closest to the claims citing it
    evidence: dict[int, list[str]]
    # claim sentences with a citation not supported
    unsupported: list[str] = field(default_factory=list)


def check_support(text: str, sources: list[Source], embed=None) -> SupportReport:
    """Mark each citation supported or not and compute the answer's grounding.

    A cited sentence is supported by source n when enough of its content words occur in n's
    passage, or (with `embed`, a function from texts to unit vectors) when it is close in meaning
    to one of the passage's sentences, and it names no number or name that the passage does not
    (`novel_terms`). A citation is supported when every sentence citing it is.
    Grounding: the share of claim sentences whose citations are all supported (a claim citing
    nothing counts against it).
    """
    by_n = {s.n: s for s in sources}
    sentences = [s for s in split_sentences(text) if is_claim(s)]
    pairs = [
        (i, n)
        for i, s in enumerate(sentences)
        for n in dict.fromkeys(parse_markers(s))
        if n in by_n
    ]
    lexical = {(i, n): lexical_overlap(sentences[i], by_n[n].passage) for i, n in pairs}
    semantic: dict[tuple[int, int], float] = {}
    closest: dict[tuple[int, int], str] = {}
    if embed is not None and pairs:
        semantic, closest = _semantic_scores(sentences, pairs, by_n, embed)
    else:
        closest = {
            (i, n): max(_passage_sentences(by_n[n]), key=lambda p: lexical_overlap(sentences[i], p))
            for i, n in pairs
        }
    verdict: dict[tuple[int, int], bool] = {}
    for key in pairs:
        lex, sem = lexical[key], semantic.get(key, 0.0)
        verdict[key] = (
            lex >= LEXICAL_SUPPORT
            or sem >= SEMANTIC_SUPPORT
            or (lex >= MIXED_LEXICAL and sem >= MIXED_SEMANTIC)
        ) and not novel_terms(sentences[key[0]], by_n[key[1]].title + " " + by_n[key[1]].passage)
    per_n: dict[int, bool] = {}
    for (_, n), ok in verdict.items():
        per_n[n] = per_n.get(n, True) and ok
    citations = [
        Citation(n=n, paper_id=by_n[n].paper_id, supported=per_n[n]) for n in sorted(per_n)
    ]
    cited_sentences = {i for i, _ in pairs}
    uncited = [s for i, s in enumerate(sentences) if i not in cited_sentences]
    grounded = sum(1 for i in cited_sentences if all(verdict[(j, n)] for j, n in pairs if j == i))
    grounding = round(grounded / len(sentences), 3) if sentences else None
    evidence: dict[int, list[str]] = {}
    for (_, n), sentence in closest.items():
        if sentence not in evidence.setdefault(n, []):
            evidence[n].append(sentence)
    unsupported = [
        s for i, s in enumerate(sentences) if any(not verdict[(j, n)] for j, n in pairs if j == i)
    ]
    return SupportReport(citations, grounding, uncited, evidence, unsupported)


def _passage_sentences(source: Source) -> list[str]:
    return split_sentences(source.passage)[:30] or [source.passage]


def _semantic_scores(sentences, pairs, by_n, embed):
    """Cosine of each (claim, cited passage) pair to the passage's closest sentence, and that
    sentence."""
    import numpy as np

    needed_n = sorted({n for _, n in pairs})
    passage_sents = {n: _passage_sentences(by_n[n]) for n in needed_n}
    claims = sorted({i for i, _ in pairs})
    texts = [MARKER.sub(" ", sentences[i]) for i in claims] + [
        s for n in needed_n for s in passage_sents[n]
    ]
    vecs = np.asarray(embed(texts), dtype=np.float32)
    claim_vec = {i: vecs[k] for k, i in enumerate(claims)}
    offset, passage_vecs = len(claims), {}
    for n in needed_n:
        passage_vecs[n] = vecs[offset : offset + len(passage_sents[n])]
        offset += len(passage_sents[n])
    scores, closest = {}, {}
    for i, n in pairs:
        sims = passage_vecs[n] @ claim_vec[i]
        best = int(sims.argmax())
        scores[(i, n)], closest[(i, n)] = float(sims[best]), passage_sents[n][best]
    return scores, closest
