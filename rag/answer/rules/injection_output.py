"""The injection output rule (layer 3 of rag/answer/injection.py): a token of the answer that looks
like a code, key, canary or URL must appear in the question, in a kept title, be a source's own
link, or be in a source sentence kept as content that relates to the question or (with the default
embedder) that the instruction probe reads as plain abstract prose; else its sentence is dropped
whole (`clean_answer`); the answer is shown only once this has run. Markdown images go; an answer
sentence that reads as an instruction, or carries a word the sources hold only inside removed
instruction text, is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rag.answer.citations import MARKER, split_sentences
from rag.answer.injection import (
    CODE_LIKE,
    MD_IMAGE,
    TOKEN,
    URL,
    fence_text,
    instruction_sentences,
    is_instruction,
    normalize,
    probe_levels,
    probe_scores,
    risky_tokens,
)

# Cosine (all-MiniLM-L6-v2) of a sentence and the question from which it relates to it: measured on
# 400 ICML 2026 abstracts asked about by title, 10% of the sentences with a code that share fewer
# than two words with the question fall below it (their codes are masked if an answer repeats them);
# see docs/robustness.md.
RELATED = 0.2
Embed = Callable[[list[str]], Sequence[Sequence[float]]]


def allowed_codes(
    question: str,
    sources: Sequence[tuple[str, str]],
    embed: Embed | None = None,
    related: float = RELATED,
    probe: Embed | None = None,
) -> set[str]:
    """The codes and URLs an answer to `question` may write, given its sources as (title, passage):
    those of the question, of the titles no rule flags, and of the passages' sentences that were
    kept as content (not instructions, not another language) and relate to the question: they
    share two of its content words (not counting words of flagged text), or, with `embed` (texts to
    unit vectors), their cosine with the question is at least `related`; with `probe` (vectors for
    the injection probe), also those it reads as plain abstract prose (under its content level),
    whatever they are about ("In-Context", of a sentence that does not name Palimpsa, was cut from
    answers about it). An answer that repeats any other code loses the sentence."""
    from rag.text import keyword_terms

    allowed = risky_tokens(question)
    flagged_words: set[str] = set()
    # the question without flagged titles it quotes: an order in a title relates to nothing
    about = question
    candidates: list[tuple[str, set[str]]] = []
    for title, passage in sources:
        fenced_title = fence_text(title)
        if any(instruction_sentences(fenced_title, title=True)):
            flagged_words |= set(keyword_terms(normalize(fenced_title)))
            about = about.replace(title, " ")
        else:
            allowed |= risky_tokens(fenced_title)
        fenced = fence_text(passage)
        for sentence, flagged in zip(
            split_sentences(fenced), instruction_sentences(fenced, embed=probe)
        ):
            if flagged:
                flagged_words |= set(keyword_terms(normalize(sentence)))
            elif codes := risky_tokens(sentence):
                candidates.append((sentence, codes))
    asked = set(keyword_terms(normalize(question))) - flagged_words
    if probe is not None and candidates:
        # A sentence the probe reads as plain abstract prose gives its codes whatever it is about.
        content, _ = probe_levels()
        scores = probe_scores([s for s, _ in candidates], probe)
        prose = [codes for (_, codes), score in zip(candidates, scores) if score < content]
        allowed |= set().union(*prose)
        candidates = [c for c, score in zip(candidates, scores) if score >= content]
    pending = []
    for sentence, codes in candidates:
        if len(asked & set(keyword_terms(normalize(sentence)))) >= 2:
            allowed |= codes
        else:
            pending.append((sentence, codes))
    if embed is not None and pending:
        vectors = [list(v) for v in embed([about] + [s for s, _ in pending])]
        q = vectors[0]
        for (_, codes), v in zip(pending, vectors[1:]):
            if sum(a * b for a, b in zip(q, v)) >= related:
                allowed |= codes
    return allowed


def _answer_rules(
    allowed_text: str,
    allowed_urls: list[str],
    removed: list[str],
    question: str,
    codes: set[str] | None,
) -> tuple[set[str], set[str]]:
    """What an answer may link to (the sources' own links, and with `codes` those of the content
    that relates to the question, else those of anything the model read), and the code-like words of
    the removed instruction text that nothing else the model read holds."""
    known = {t.lower() for t in TOKEN.findall(allowed_text + " " + question)}
    payload = {t.lower() for r in removed for t in TOKEN.findall(r) if CODE_LIKE.search(t)} - known
    links = (
        {u for u in URL.findall(allowed_text)}
        if codes is None
        else {c for c in codes if URL.match(c)}
    )
    return set(allowed_urls) | links, payload


# A markdown link, its text and its URL; bounded, and no bracket inside (as MD_IMAGE).
_LINK = re.compile(r"\[([^\[\]]{0,1000})\]\(([^()\[\]\s]{0,2000})[^()\[\]]{0,2000}\)")


def _url_allowed(url: str, allowed: set[str]) -> bool:
    url = url.rstrip(".,;:)")
    return url in allowed or url.casefold() in allowed


def _word_allowed(word: str, codes: set[str] | None, urls: set[str]) -> bool:
    """Whether every code-like token and URL of `word` is one the answer may write."""
    if codes is None:
        return True
    allowed_urls = {u.casefold() for u in urls}
    return all(
        t in codes or t in allowed_urls or t.rstrip("/") in allowed_urls for t in risky_tokens(word)
    )


@dataclass
class CleanedAnswer:
    text: str
    dropped: list[str] = field(default_factory=list)  # sentences and links taken out


def clean_answer(
    text: str,
    allowed_text: str,
    allowed_urls: list[str],
    removed: list[str],
    question: str = "",
    codes: set[str] | None = None,
) -> CleanedAnswer:
    """The answer without what only an injection would put there (layer 3).

    `allowed_text`: what the model was given (question and sanitized sources), whose URLs may be
    repeated; `allowed_urls`: the sources' own links; `removed`: the text taken out of the sources
    as instructions, whose words no answer needs; `codes` (`allowed_codes`): the codes and URLs the
    answer may write at all, when given: a sentence holding any other is dropped whole (a word
    masked in place left "The code word is … [1]." standing, and a true sentence with a hole).
    """
    dropped: list[str] = []
    allowed, forbidden = _answer_rules(allowed_text, allowed_urls, removed, question, codes)

    def image(m: re.Match) -> str:
        dropped.append(m.group(0))
        return ""

    def link(m: re.Match) -> str:
        url = m.group(2).strip()
        if _url_allowed(url, allowed):
            return m.group(0)
        dropped.append(m.group(0))
        return m.group(1)

    def bare(m: re.Match) -> str:
        if _url_allowed(m.group(0), allowed):
            return m.group(0)
        dropped.append(m.group(0))
        return "(link removed)"

    text = MD_IMAGE.sub(image, text)
    text = _LINK.sub(link, text)
    text = re.sub(r"(?<!\]\()" + URL.pattern, bare, text, flags=re.I)
    kept_lines = []
    for line in text.split("\n"):
        sentences = split_sentences(line) if line.strip() else []
        keep = []
        for s in sentences:
            bare_text = MARKER.sub(" ", s)
            words = {t.lower() for t in TOKEN.findall(bare_text)}
            if (
                is_instruction(bare_text)
                or words & forbidden
                or not all(_word_allowed(w, codes, allowed) for w in bare_text.split())
            ):
                dropped.append(s)
            else:
                keep.append(" ".join(s.split()))
        if keep or not line.strip():
            kept_lines.append(" ".join(keep) if sentences else line)
    return CleanedAnswer("\n".join(kept_lines).strip(), dropped)
