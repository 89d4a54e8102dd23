"""The question's topic terms that no retrieved paper holds: "is there a paper on early-exit
transformers?" asked of papers none of which says "early exit".

A small model handed five abstracts answers from whatever is closest, so a topic the papers do not
cover gets an answer about something else (docs/lab/answers-history.md). A topic term is a word or a
two-word phrase that names a subject in machine-learning writing, from a list (`topic_terms.txt.gz`,
built by `scripts/build_topic_terms.py` from ~100k abstracts of 1987-2025, where its criteria are):
words and phrases that recur in abstracts, are specific, are put in titles and, for words, in
authors' keyword lists, and are rare in everyday English ("spiking", "splatting", "knowledge graph",
"induction heads"; not "loops", "spotting" or "painfully"). Names count too ("GPT-3",
"FlashAttention"). A term is held when a retrieved paper's title or abstract has its stem
(Snowball), a word beginning with it, or, for a phrase, the two stems side by side; a name, when a
paper writes it (case, hyphens and a final s aside).
"""

from __future__ import annotations

import functools
import gzip
import re
from importlib import resources
from typing import TYPE_CHECKING

from rag.text import COMPARED_NAME, STOPWORDS
from rag.text import _snowball as _stem  # the stemmer (one per thread), made on first use

if TYPE_CHECKING:
    from rag.retrieve.search import Hit

TERMS_FILE = "topic_terms.txt.gz"

# A word, with its hyphenated parts ("early-exit", "gpt-4o"). "n't" and "'s" end a phrase ("an LLM's
# pretraining data" holds no phrase "LLM pretraining").
_WORD = re.compile(r"[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*")
_CLITIC = re.compile(r"n't\b|'s\b|’s\b|n’t\b", re.IGNORECASE)
# a stem this long held as the start of a longer word ("backprop" in "backpropagation")
_PREFIX_MIN = 5
# A name's candidates (`_is_name` decides): words with their hyphenated and dotted parts
# ("Qwen2.5-VL").
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-.][A-Za-z0-9]+)*")
# Not topic words: the stopwords, and the asker's own "me", "my" and "us" ("tell me about X" holds
# no topic phrase "tell me"; kept out of the shared stopwords, which the keyword index reads).
_NOT_TOPIC = STOPWORDS | {"me", "my", "us"}
# The share of the question's words that absent terms must make up: one term in a short question
# ("any papers on gaussian splatting?"), more in a long one, which describes its paper in many words
# of which one or two may be the asker's own (of 80 paraphrases of 230-450 characters, 29 have a
# topic word their paper does not write).
ABSENT_SHARE = 0.1


def words(text: str) -> list[list[str]]:
    """The words of `text`, lowercased, each as its hyphen-separated parts; stopwords left out."""
    return [
        [p for p in w.lower().split("-") if p]
        for w in _WORD.findall(_CLITIC.sub(" the ", text))
        if w.lower() not in _NOT_TOPIC
    ]


def written_phrases(text: str) -> list[tuple[str, str]]:
    """The two-word phrases of `text`, lowercased: two adjacent words with no stopword or hyphenated
    word between them, and each two-part hyphenated word ("early-exit" is the phrase "early exit").
    """
    pairs: list[tuple[str, str]] = []
    previous: str | None = None
    for token in _WORD.findall(_CLITIC.sub(" the ", text)):
        lower = token.lower()
        if lower in _NOT_TOPIC:
            previous = None
            continue
        parts = [p for p in lower.split("-") if p]
        if len(parts) == 2:
            pairs.append((parts[0], parts[1]))
        if len(parts) == 1 and previous is not None:
            pairs.append((previous, parts[0]))
        previous = parts[0] if len(parts) == 1 else None
    return pairs


def units(text: str) -> tuple[set[str], set[str]]:
    """The word stems (Snowball; each part of a hyphenated word is a word) and the phrase stems of
    `text`."""
    stem = _stem()
    return (
        {stem(p) for w in words(text) for p in w},
        {f"{stem(a)} {stem(b)}" for a, b in written_phrases(text)},
    )


@functools.cache
def topic_terms() -> tuple[frozenset[str], frozenset[str]]:
    """The topic words (as written, lowercased) and phrases (as stems) of `TERMS_FILE`."""
    data = resources.files("rag.answer.rules").joinpath(TERMS_FILE).read_bytes()
    single: set[str] = set()
    phrase: set[str] = set()
    for line in gzip.decompress(data).decode().splitlines():
        kind, _, term = line.partition(" ")
        (single if kind == "w" else phrase).add(term)
    return frozenset(single), frozenset(phrase)


def absent_topic(question: str, texts: list[str]) -> list[str]:
    """The question's topic terms and names that none of `texts` holds, when they make up at least
    `ABSENT_SHARE` of its words; else none."""
    found: dict[str, str] = {}
    for term in missing_topic_terms(question, texts) + missing_names(question, texts):
        written = re.search(re.escape(term), question, re.IGNORECASE)
        # "NeRF" once, as written
        found.setdefault(term.lower(), written.group(0) if written else term)
    return (
        list(found.values()) if found and len(found) >= ABSENT_SHARE * len(words(question)) else []
    )


def absent_from(question: str, hits: list[Hit]) -> list[str]:
    """`absent_topic` over the retrieved papers' titles and whole abstracts."""
    return absent_topic(question, [h.title_and_abstract for h in hits])


def named(terms: list[str]) -> str:
    """The terms as an answer names them: “a”, “b” or “c”."""
    quoted = [f"“{t}”" for t in terms]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1] if len(quoted) > 1 else "".join(quoted)


def missing_names(question: str, texts: list[str]) -> list[str]:
    """The names of the question (`_NAME`; a hyphenated word without a digit is judged by its parts,
    so "GRPO-style" by "GRPO") that none of `texts` writes, ignoring case, hyphens and a final s;
    not those it only compares with."""
    written = " ".join(_folded(w) for text in texts for w in text.split())
    # A name the question only compares with ("a paper like DreamBooth but for crystals") asks about
    # another paper, as the retrieval rule has it (rag/index/keyword.py).
    compared = {m.group(1) for m in COMPARED_NAME.finditer(question)}
    names: list[str] = []
    for word in _NAME.findall(question):
        if word in compared:
            continue
        parts = word.split("-") if "-" in word and not any(c.isdigit() for c in word) else [word]
        names.extend(p for p in parts if _is_name(p))
    return [n for n in names if _folded(n).removesuffix("s") not in written]


def _is_name(word: str) -> bool:
    """A capital after the first letter ("GPT-3", "FlashAttention", "BLEU") or a digit beside a
    letter ("word2vec", "gpt-4o"); not "top-1" or "2x"."""
    return (
        len(word) >= 3
        and word[0].isalpha()
        and sum(c.isalpha() for c in word) >= 2
        and (
            any(c.isupper() for c in word[1:])
            or re.search(r"[a-z][0-9]|[0-9][a-z]", word.lower()) is not None
        )
    )


def _folded(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", word.lower())


def missing_topic_terms(question: str, texts: list[str]) -> list[str]:
    """The question's topic terms (as the question writes them) that none of `texts` holds."""
    topic_words, topic_phrases = topic_terms()
    stem = _stem()
    held_stems: set[str] = set()
    held_phrases: set[str] = set()
    held_words: set[str] = set()
    for text in texts:
        singles, phrases = units(text)
        held_stems |= singles
        held_phrases |= phrases
        held_words.update(p for w in words(text) for p in w)

    def held(part: str) -> bool:
        s = stem(part)
        return s in held_stems or (
            len(s) >= _PREFIX_MIN and any(w.startswith(s) for w in held_words)
        )

    missing: list[str] = []
    for parts in words(question):
        missing.extend(p for p in parts if p in topic_words and not held(p))
    spans: list[str] = []
    for a, b in written_phrases(question):
        phrase = f"{stem(a)} {stem(b)}"
        if (
            phrase in topic_phrases
            and phrase not in held_phrases
            and a not in missing
            and b not in missing
        ):
            # "estimating heterogeneous" + "heterogeneous treatment"
            if spans and spans[-1].endswith(f" {a}"):
                spans[-1] += f" {b}"
            else:
                spans.append(f"{a}-{b}" if f"{a}-{b}" in question.lower() else f"{a} {b}")
    return list(dict.fromkeys(missing + spans))
