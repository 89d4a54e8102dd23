"""Evidence-first answers: what the model reads and what it is asked to write.

The sources' sentences are numbered in the prompt ("2.3" is the third sentence shown of source 2),
and the model replies in two lines: ``EVIDENCE:`` the numbers of the sentences that state the answer
(or ``NONE``), then ``ANSWER:`` one or two sentences of synthesis, each ending with its ``[n]``. The
answer shown is the chosen sentences quoted, then that synthesis: the quotes are exact by
construction, so the key facts the model picked reach the reader even when its own wording slips
(and they can be shown before the synthesis is written), and "which papers ...?" questions become a
list built from the quoted sentences, one line per paper.

Why this shape (measured with Qwen2.5-Coder-1.5B, `bench/answers/quality.py`): the free-form prompt
cut each source to 100 tokens and asked a yes/no question about all of them; most refusals of
answerable questions came from that cut, and the yes/no barely separated answerable from near-miss
questions. Naming a sentence is a narrower question a small model answers better, and a ``NONE`` on
papers that are on the subject is what a "not stated" answer is made of.

This module has no model and no I/O: `choose_sentences` picks what each source shows,
`build_messages` writes the prompt, `ReplyParser` reads the reply as it streams.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rag import prompts
from rag.answer.citations import split_sentences
from rag.answer.injection import fence_text, instruction_sentences
from rag.latex import plain_prose
from rag.text import count_tiktoken, keyword_terms

Embed = Callable[[list[str]], Sequence[Sequence[float]]]

# "Which papers ...?", "What work ...?", "Are there papers on ...?", "List papers that ...":
# answered as a list of the papers that fit, each with the sentence that makes it fit.
_LIST_QUESTION = re.compile(
    r"^\s*(?:(?:which|what|name|list|find|show(?: me)?|give(?: me)?)\s+(?:\w+\s+){0,3}?"
    r"(?:papers?|works?|studies|articles|methods|approaches|abstracts)\b"
    r"|(?:are|is) there (?:any |some"
    r" )?(?:\w+\s+){0,2}?(?:papers?|works?|studies|research|methods|approaches)\b"
    r"|(?:does|do) (?:any|some) (?:\w+\s+){0,2}?(?:papers?|works?|studies)\b"
    r"|(?:any|some) (?:papers?|work|studies|research) (?:on|about|in|with|using|working|that)\b"
    r"|(?:is there )?anything (?:on|about|in here on)\b|looking for"
    r" (?:work|papers|research|studies) (?:on|about)\b"
    r"|what's (?:in )?(?:here|there) (?:on|about)\b)"
    r"|,\s*any (?:papers?|work)\s*\?\s*$",
    re.I,
)
_EVIDENCE_ID = re.compile(r"\b(\d{1,2})\.(\d{1,2})\b")
_NONE = re.compile(r"\bnone\b|\bno sentence", re.I)
# A label's line may start with spaces, not with blank lines: `^\s*` scanned every blank line to the
# end of the text from each line's start.
_ANSWER_LABEL = re.compile(r"^[^\S\n]*\**answer\**[^\S\n]*:\s*", re.I | re.M)
_EVIDENCE_LABEL = re.compile(r"^[^\S\n]*\**evidence\**[^\S\n]*:", re.I | re.M)
# A citation of a sentence, "[2.3]", is a citation of its source, "[2]".
_SENTENCE_MARKER = re.compile(r"\[\s*(\d{1,2})\.\d{1,2}\s*\]")


def is_list_question(question: str) -> bool:
    """Whether the question asks which papers do something (answered as a list of papers)."""
    return bool(_LIST_QUESTION.search(question))


@dataclass
class ShownSource:
    """A source as the model reads it: its number, title and the sentences shown, in abstract
    order."""

    n: int
    title: str
    sentences: list[str]

    def render(self) -> str:
        lines = "\n".join(f"{self.n}.{i} {s}" for i, s in enumerate(self.sentences, 1))
        return prompts.EVIDENCE_SOURCE_TEMPLATE.format(n=self.n, title=self.title, sentences=lines)


def source_sentences(abstract: str, probe: Embed | None = None) -> list[str]:
    """The sentences of an abstract a model may read: in plain prose (`plain_prose`), fenced,
    without instruction-like sentences (rag/answer/injection.py; `probe`: vectors for its probe),
    each on one line."""
    # fenced before LaTeX becomes text too: "---" of a markdown table would be an em dash
    fenced = fence_text(plain_prose(fence_text(abstract)))
    return [
        " ".join(s.split())
        for s, dropped in zip(split_sentences(fenced), instruction_sentences(fenced, embed=probe))
        if not dropped and s.strip()
    ]


def choose_sentences(
    question: str,
    abstracts: list[list[str]],
    whole_tokens: int,
    source_tokens: int,
    embed: Embed | None = None,
) -> list[list[str]]:
    """For each source (its sentences, best source first), the sentences to show, in abstract order.

    The best source is shown whole up to `whole_tokens` (the question is most likely about it, and a
    key fact can sit in any sentence); the others keep the sentences closest to the question up to
    `source_tokens` each. Closeness: cosine with `embed` plus the share of the question's words the
    sentence holds (without `embed`, that share alone)."""
    flat = [s for sentences in abstracts for s in sentences]
    if not flat:
        return [[] for _ in abstracts]
    asked = set(keyword_terms(question))
    overlap = [len(asked & set(keyword_terms(s))) / max(len(asked), 1) for s in flat]
    if embed is not None:
        import numpy as np

        vectors = np.asarray(embed([question, *flat]), dtype=np.float32)
        cosine = (vectors[1:] @ vectors[0]).tolist()
        scores = [c + 0.5 * o for c, o in zip(cosine, overlap)]
    else:
        scores = overlap
    out: list[list[str]] = []
    at = 0
    for rank, sentences in enumerate(abstracts):
        score = scores[at : at + len(sentences)]
        at += len(sentences)
        keep = best_within(
            sentences, score, whole_tokens if rank == 0 else source_tokens, per_sentence=3
        )
        out.append([sentences[i] for i in keep])
    return out


def best_within(
    sentences: list[str], score: Sequence[float], budget: int, per_sentence: int = 1
) -> list[int]:
    """The indexes of the best-scoring sentences whose tokens (plus `per_sentence` each, for their
    numbering or the space between them) fit in `budget`, in their order; the best one always."""
    keep: set[int] = set()
    used = 0
    for i in sorted(range(len(sentences)), key=lambda i: -score[i]):
        cost = count_tiktoken(sentences[i]) + per_sentence
        if keep and used + cost > budget:
            continue
        keep.add(i)
        used += cost
    return sorted(keep)


def build_messages(
    question: str, shown: list[ShownSource], budget_tokens: int, list_question: bool = False
) -> tuple[list[dict], int]:
    """System, worked example and user messages, and how many sources fit in `budget_tokens` (the
    weakest dropped first)."""
    blocks: list[str] = []
    used = 0
    for source in shown:
        block = source.render()
        cost = count_tiktoken(block)
        if blocks and used + cost > budget_tokens:
            break
        blocks.append(block)
        used += cost
    template = prompts.EVIDENCE_LIST_QUESTION if list_question else prompts.EVIDENCE_QUESTION
    user = template.format(sources="\n\n".join(blocks), question=question)
    return (
        [
            {"role": "system", "content": prompts.EVIDENCE_SYSTEM_PROMPT},
            *prompts.EVIDENCE_EXAMPLE_TURNS,
            {"role": "user", "content": user},
        ],
        len(blocks),
    )


@dataclass
class ReplyParser:
    """Reads the model's reply as it streams: first the ``EVIDENCE:`` line, then the synthesis.

    `feed` returns the synthesis text that may be shown now (none until the evidence line is
    complete); `evidence` is the list of (source n, sentence index) picked, `none` whether the model
    said no sentence states the answer. A reply without the labels is taken whole as the synthesis.
    """

    n_sources: int
    shown: list[ShownSource]
    evidence: list[tuple[int, int]] = field(default_factory=list)
    none: bool = False
    decided: bool = False
    _head: str = ""
    _tail: str = ""

    def feed(self, piece: str) -> str:
        if self.decided:
            return self._synthesis(piece)
        self._head += piece
        label = _ANSWER_LABEL.search(self._head)
        if label is None:
            start = self._head.lstrip().lstrip("*").lower()
            if not _EVIDENCE_LABEL.search(self._head) and (
                "\n" in self._head.lstrip()
                or not ("evidence:".startswith(start[:9]) or start.startswith("evidence"))
            ):
                # No evidence line at all: the reply is the synthesis.
                self.decided = True
                text, self._head = self._head, ""
                return self._synthesis(text)
            return ""
        self._read_evidence(self._head[: label.start()])
        self.decided = True
        rest, self._head = self._head[label.end() :], ""
        return self._synthesis(rest)

    def close(self) -> str:
        if not self.decided:
            self.decided = True
            head, self._head = self._head, ""
            if _EVIDENCE_LABEL.search(head):
                self._read_evidence(head)
                return ""
            return self._synthesis(head) + self._flush()
        return self._flush()

    def _read_evidence(self, text: str) -> None:
        line = _EVIDENCE_LABEL.sub("", text)
        for m in _EVIDENCE_ID.finditer(line):
            self._add(int(m.group(1)), int(m.group(2)))
        self.none = not self.evidence and bool(_NONE.search(line))

    def _add(self, n: int, i: int) -> None:
        if 1 <= n <= min(self.n_sources, len(self.shown)) and 1 <= i <= len(
            self.shown[n - 1].sentences
        ):
            if (n, i) not in self.evidence:
                self.evidence.append((n, i))

    def _synthesis(self, text: str) -> str:
        # "[2.3]" becomes "[2]" (and names sentence 2.3 as evidence); an unfinished "[2." is held.
        text = self._tail + text
        cut = text.rfind("[")
        if cut >= 0 and "]" not in text[cut:] and len(text) - cut <= 8:
            text, self._tail = text[:cut], text[cut:]
        else:
            self._tail = ""
        return self._rewrite(text)

    def _flush(self) -> str:
        text, self._tail = self._tail, ""
        return self._rewrite(text)

    def _rewrite(self, text: str) -> str:
        def cite(m: re.Match) -> str:
            n, i = (int(x) for x in _EVIDENCE_ID.findall(m.group(0))[0])
            self._add(n, i)
            return f"[{n}]"

        return _SENTENCE_MARKER.sub(cite, text)

    def quotes(self) -> list[tuple[int, str]]:
        """The evidence as (source n, sentence), in the order the model named it."""
        return [(n, self.shown[n - 1].sentences[i - 1]) for n, i in self.evidence]


def settle_evidence(
    picked: list[tuple[int, int]],
    shown: list[ShownSource],
    synthesis: str,
    question: str,
    list_question: bool,
    embed: Embed,
    most: int | None = None,
) -> list[tuple[int, int]]:
    """The sentences to quote, from the model's picks checked against what it wrote; at most
    `most` of them (not for a list), the closest to what they are quoted for, in the model's order:
    it sometimes names every sentence it was shown, setup and motivation first.

    A 1.5B model names the sentence next to the one it means about as often as the right one, so
    each pick may move to a neighbour closer in meaning to the synthesis sentences that cite its
    source (the question, when none does). With no synthesis yet (the quotes shown before it is
    written), each pick is quoted with its neighbour closest to the question, when that is another:
    of 81 key facts of the two-part questions, the quotes held 44 so (2.3 lines an answer), 39 with
    the picks alone, 33 moved toward the question or toward the synthesis (1.7 lines). A source the
    synthesis cites without a pick gets its sentence closest to that synthesis. For a "which
    papers" question each paper named gets one sentence: the one closest to the question, since it
    is quoted to show why the paper fits."""
    import numpy as np

    from rag.answer.citations import MARKER, parse_markers

    claims = [s for s in split_sentences(synthesis) if parse_markers(s)]
    # A source may show no sentence (all of it read as instructions): nothing of it can be quoted.
    cited = [
        n
        for s in claims
        for n in parse_markers(s)
        if 1 <= n <= len(shown) and shown[n - 1].sentences
    ]
    picked = [(n, i) for n, i in picked if shown[n - 1].sentences]
    papers = list(dict.fromkeys([n for n, _ in picked] + cited))
    if not papers:
        return []
    texts = [question] + [MARKER.sub(" ", c) for c in claims]
    index: dict[tuple[int, int], int] = {}
    for n in papers:
        for i, sentence in enumerate(shown[n - 1].sentences, 1):
            index[(n, i)] = len(texts)
            texts.append(sentence)
    vectors = np.asarray(embed(texts), dtype=np.float32)

    def target(n: int):
        about = [1 + k for k, c in enumerate(claims) if n in parse_markers(c)]
        rows = vectors[about] if about and not list_question else vectors[:1]
        return rows.mean(axis=0)

    def closest(n: int, candidates: list[int]) -> int:
        goal = target(n)
        return max(candidates, key=lambda i: float(vectors[index[(n, i)]] @ goal))

    out: list[tuple[int, int]] = []
    if list_question:
        for n in papers:
            out.append((n, closest(n, list(range(1, len(shown[n - 1].sentences) + 1)))))
        return out
    for n, i in picked:
        near = [j for j in (i - 1, i, i + 1) if 1 <= j <= len(shown[n - 1].sentences)]
        # Without claims the question alone cannot tell which of the two the model meant: both.
        for j in [closest(n, near)] if claims else sorted({i, closest(n, near)}):
            if (n, j) not in out:
                out.append((n, j))
    for n in dict.fromkeys(cited):
        if all(m != n for m, _ in out):
            out.append((n, closest(n, list(range(1, len(shown[n - 1].sentences) + 1)))))
    if most is not None and len(out) > most:
        # the papers the synthesis cites first, then the sentences closest to the claims citing
        # them, or to the question
        def fit(p: tuple[int, int]) -> tuple[bool, float]:
            v = vectors[index[p]]
            return p[0] in cited, max(float(v @ target(p[0])), float(v @ vectors[0]))

        best = set(sorted(out, key=fit, reverse=True)[:most])
        out = [p for p in out if p in best]
    return out
