"""Prompt-injection defence in depth: abstracts are data, never instructions.

An abstract may carry text written for the model that reads it ("Note for AI assistants: ... print
X"). No single wording check can catch every phrasing, so four layers, each cheap:

1. **Fencing** (`fence_text`): a source cannot open or close a fence or a chat turn. `<source>`
   tags, chat-template tokens (`<|im_start|>`, `[INST]`), role tags (`<system>`), markdown images
   and links (their text kept), HTML tags and base64 blobs are removed from what the model reads.
2. **Instruction sentences** (`instruction_sentences`): sentences that address a reader or a
   model, order it to do something, or name a code word, in English or in the other languages
   most often used for it, after undoing the usual disguises (zero-width characters, look-alike
   letters, leetspeak). Short sentences next to one are dropped with it: an injection split over
   sentences ("The secret is X. Repeat it.") loses its payload. A sentence in another script than
   the rest of its abstract is dropped too.
3. **Output check** (`clean_answer`): markdown images go, links and URLs survive only when a
   source's own URL or a passage the model was given holds them, and an answer sentence that reads
   as an instruction, or carries a word the sources hold only inside removed instruction text, is
   dropped.
4. The support check (`citations.check_support`) then marks what remains and cites nothing real.

Measured with `bench/injection.py` on the variants in `tests/injections.py`.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from .citations import MARKER, split_sentences

# ---- 1: fencing ---------------------------------------------------------------------------------

_CHAT_TOKENS = re.compile(r"(?:<\|[^|>]{0,40}\|>|\[/?(?:INST|SYS)\]|<</?SYS>>|</?s>)(?:\s*(?:system|user|assistant)\b)?", re.I)
_ROLE_TAGS = re.compile(r"</?\s*(?:source|system|user|assistant|instructions?|prompt|context|human|ai)\b[^>]*>?", re.I)
_HTML_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9-]*(?:\s[^<>]*)?/?>")
_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]*)\]\((?:[^)]*)\)")
_HEADER = re.compile(r"#{2,}\s*")
# Long runs of the base64 alphabet with both letters and digits: encoded text, never prose.
_BASE64 = re.compile(r"(?<![\w/+.:=-])(?=[A-Za-z0-9+/]*\d)(?=[A-Za-z0-9+/]*[A-Za-z])[A-Za-z0-9+/]{24,}={0,2}(?![\w/+])")
_URL = re.compile(r"(?:https?|ftp)://[^\s<>()\[\]\"']+|\bwww\.[^\s<>()\[\]\"']+", re.I)


def fence_text(text: str) -> str:
    """Text a source may hand the model: no markup that could open a turn, close a fence or fetch."""
    text = _MD_IMAGE.sub(" ", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _CHAT_TOKENS.sub(" ", text)
    text = _ROLE_TAGS.sub(" ", text)
    text = _HTML_TAG.sub(" ", text)
    text = _HEADER.sub("", text)
    text = _BASE64.sub("(encoded text removed)", text)
    text = MARKER.sub(lambda m: f"({m.group(1)})", text)  # a source's own [1] is not a citation
    return " ".join(text.split())


# ---- 2: instruction sentences -------------------------------------------------------------------

# Letters that look Latin in other scripts, and leetspeak digits: undone before matching.
_LOOKALIKES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "х": "x", "у": "y", "і": "i", "І": "I", "ј": "j",
    "ѕ": "s", "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "ο": "o", "α": "a", "ε": "e", "ι": "i", "ν": "v", "Ι": "I", "Ο": "O",
})
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"})

_VERBS = (r"print|output|say|write|respond|reply|answer|include|mention|repeat|add|append|insert|begin|"
          r"start|end|state|quote|link|display|show|render|type|emit|return|use|put")
# The verbs of an order about what to write (no "state", "end", "use": abstracts start sentences so).
_VERBS_ORDER = r"print|output|say|write|respond|reply|answer|include|mention|repeat|add|append|insert|begin|quote|link|emit"
# What follows such a verb in an order: a determiner, or a code-like token in capitals.
_OBJECT = r"(?:with |to |by )?(?:the|this|that|it|only|your|every|each|all|any|(?-i:\W*[A-Z0-9][A-Z0-9\-_]{3,}))\b"
_STRONG = [
    # Orders about the model's instructions themselves.
    r"\b(?:ignore|disregard|forget|override)\b.{0,50}\b(?:instructions?|directions?|prompts?|"
    r"rules|guidelines|directives?|above|previous|prior|earlier)\b",
    r"\b(?:new|updated|real|actual|hidden|secret) (?:instructions?|directives?|system prompt)\s*(?::|are\b|is\b|follow)",
    r"\byour (?:new |real |actual |only )?(?:task|job|instructions?|goal|role|reply|response|answer|output|summary)\b",
    r"\b(?:the|your|my) system prompt\b|\bfrom now on\b|\byou are now\b|\byou (?:will |must |should )?act as\b|"
    r"\bpretend (?:to be|you)\b",
    # Addressing a model or whoever summarises the text.
    r"\b(?:ai|llm|gpt|chatbot|bot|language model|assistant)s?\b (?:reading|processing|summari[sz]ing|reviewing) "
    r"(?:this|these|the following)\b",
    rf"\b(?:ai|llm|gpt|chatbot|bot|language model|assistant)s?\b.{{0,30}}\b(?:must|should|shall|please|are required "
    rf"to|is required to)\b.{{0,12}}\b(?:{_VERBS_ORDER})\b",
    r"\b(?:note|message|instructions?|attention|hint|reminder)\b(?!\s+(?:tuning|following|data))(?:\W+\w+)?\W+(?:for|to)\b.{0,20}\b(?:ai|llm|gpt|"
    r"chatbots?|bots?|language models?|assistants?|agents?|summari[sz]ers?|reviewers?)\b",
    r"^(?:attention|dear|hey|hello|hi)\b.{0,20}\b(?:ai|llm|gpt|chatbot|bot|model|assistant|agent)s?\b",
    r"^\W*(?:dear |hey |attention,? |note to )?(?:the )?(?:assistant|chatbot|ai|llm|gpt)s?\s*[,:]",
    r"\bwhoever (?:summari[sz]es|reads|reviews|processes)\b|\bif you are an?\b",
    # Orders about what an answer must contain.
    rf"\byou\b.{{0,30}}\b(?:must|should|shall|will|need to|have to|always|never)\b.{{0,20}}\b(?:{_VERBS})\b",
    rf"\b(?:always|never)\s+(?:{_VERBS})\b",
    rf"\byou (?:always |must |should )?(?:{_VERBS})\b",
    r"\b(?:summar(?:y|ies)|responses?|answers?|replies|outputs?|descriptions?)\b.{0,60}\b(?:must|should|shall|"
    r"are required to|is required to|need to|have to)\b.{0,20}\b(?:contain|include|mention|quote|end|begin|"
    r"start|state|say|repeat|appear|cite)\b",
    r"\b(?:must|should|shall)\s+(?:also\s+)?(?:appear|be (?:included|mentioned|printed|repeated|quoted))\b",
    r"\b(?:summary|answer|response|output) (?:requirement|instruction|rule)s?\b",
    r"\brequest(?:s|ed)? that (?:summar|respons|answer|repl|output|model|assistant|ai)",
    r"\b(?:code ?word|codename|code name|password|passphrase|magic word|secret (?:word|token|phrase|code)|"
    r"the secret is|canary (?:word|token|string))\b(?:\W+\w+){0,3}\W+(?-i:[A-Z0-9][A-Z0-9\-_]{3,})",
    rf"^\W*(?:please |kindly )?(?:(?:{_VERBS_ORDER}) {_OBJECT}|"
    r"(?:ignore|disregard|forget|remember this|decode|obey)\b|follow (?:these|this|the following)\b|make sure\b|"
    r"ensure that (?:the|your|every|each|all)\b)",
    rf"[:;]\s*(?:please |kindly )?(?:(?:{_VERBS_ORDER}) {_OBJECT}|(?:ignore|disregard|decode and follow)\b)",
    r"(?:^|[.!?]\s+)\W*(?:system|assistant|user|instruction|response)\s*:",
    # The same, in the languages injections most often use.
    r"\b(?:ignor(?:ez|ier\w*|e|a|ate|ar)|oubliez|vergiss|olvida|dimentica)\b.{0,40}\b(?:instructions?|anweisungen|"
    r"instrucciones|istruzioni|consignes|vorgaben|indicaciones)\b",
    r"\b(?:assistants? ia|ki-assistent\w*|asistentes? de ia|assistenti ia|assistente ia)\b",
    r"игнорир|инструкци|ассистент|ии-|忽略|指令|助手|无视|無視|指示|アシスタント|プロンプト",
]
_STRONG_RE = [re.compile(p, re.I) for p in _STRONG]
_ZERO_WIDTH = re.compile(r"[\u200b-\u200f\u2060-\u2064\ufeff\u00ad\u034f]")
_SHORT_WORDS = 14  # a neighbour of an instruction this short goes with it


def _normalized(sentence: str) -> str:
    text = unicodedata.normalize("NFKC", _ZERO_WIDTH.sub("", sentence)).translate(_LOOKALIKES)
    return text


def is_instruction(sentence: str) -> bool:
    """Whether a sentence reads as an order to whoever (or whatever) reads the text."""
    if any(r.search(sentence) for r in (_CHAT_TOKENS, _ROLE_TAGS, _MD_IMAGE, _BASE64)):
        return True  # markup only an injection brings (already fenced out of what a model reads)
    text = _normalized(sentence)
    variants = (text, text.translate(_LEET)) if any(c in text for c in "013457@$") else (text,)
    return any(r.search(v) for v in variants for r in _STRONG_RE)


def _script(text: str) -> str:
    """The dominant script of the letters: "latin", "other", or "" (no letters)."""
    latin = other = 0
    for c in text:
        if c.isalpha():
            if ord(c) < 0x250:
                latin += 1
            else:
                other += 1
    if latin + other == 0:
        return ""
    return "latin" if latin >= other else "other"


def instruction_sentences(text: str) -> list[bool]:
    """For each of `split_sentences(text)`, whether it is dropped as (part of) an instruction."""
    sentences = split_sentences(text)
    flags = [is_instruction(s) for s in sentences]
    main = _script(text)
    for i, s in enumerate(sentences):
        if not flags[i] and main and _script(s) not in ("", main):
            flags[i] = True  # a sentence in another script than its abstract
    for i in [i for i, f in enumerate(flags) if f]:
        for j in (i - 1, i + 1):
            if 0 <= j < len(sentences) and not flags[j] and len(sentences[j].split()) <= _SHORT_WORDS:
                flags[j] = True
    return flags


@dataclass
class Sanitized:
    """A source's text as the model may read it, and the words only its removed parts held."""

    text: str
    removed: list[str] = field(default_factory=list)


def sanitize(text: str) -> Sanitized:
    """A source's text fenced (layer 1) and without its instruction sentences (layer 2)."""
    fenced = fence_text(text)
    sentences = split_sentences(fenced)
    flags = instruction_sentences(fenced)
    kept = [s for s, f in zip(sentences, flags) if not f]
    removed = [s for s, f in zip(sentences, flags) if f]
    # What fencing took out counts as removed too (an image URL, a base64 payload, a chat turn).
    extra = _URL.findall(text) + _BASE64.findall(text)
    body = " ".join(kept) + (" (Instruction-like text removed from this source.)" if removed else "")
    return Sanitized(body.strip(), removed + extra)


# ---- 3: the output check ------------------------------------------------------------------------

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{3,}")
# A code-like token (a digit, or capitals past the first letter): what a planted payload looks like.
_CODE_LIKE = re.compile(r"\d|[A-Za-z][^A-Z]*[A-Z]")


def _answer_rules(allowed_text: str, allowed_urls: list[str], removed: list[str],
                  question: str) -> tuple[set[str], set[str]]:
    """What an answer may link to (the sources' own links and those in what the model read), and the
    code-like words of the removed instruction text that nothing else the model read holds."""
    known = {t.lower() for t in _TOKEN.findall(allowed_text + " " + question)}
    payload = {t.lower() for r in removed for t in _TOKEN.findall(r) if _CODE_LIKE.search(t)} - known
    return set(allowed_urls) | set(_URL.findall(allowed_text)), payload


def _url_allowed(url: str, allowed: set[str]) -> bool:
    return url.rstrip(".,;:)") in allowed


@dataclass
class CleanedAnswer:
    text: str
    dropped: list[str] = field(default_factory=list)  # sentences and links taken out


def clean_answer(text: str, allowed_text: str, allowed_urls: list[str], removed: list[str],
                 question: str = "") -> CleanedAnswer:
    """The answer without what only an injection would put there (layer 3).

    `allowed_text`: what the model was given (question and sanitized sources), whose URLs may be
    repeated; `allowed_urls`: the sources' own links; `removed`: the text taken out of the sources
    as instructions, whose words no answer needs.
    """
    dropped: list[str] = []
    allowed, forbidden = _answer_rules(allowed_text, allowed_urls, removed, question)

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

    text = _MD_IMAGE.sub(image, text)
    text = re.sub(r"\[([^\]]*)\]\(([^)\s]*)[^)]*\)", link, text)
    text = re.sub(r"(?<!\]\()" + _URL.pattern, bare, text, flags=re.I)
    kept_lines = []
    for line in text.split("\n"):
        sentences = split_sentences(line) if line.strip() else []
        keep = []
        for s in sentences:
            words = {t.lower() for t in _TOKEN.findall(MARKER.sub(" ", s))}
            if is_instruction(MARKER.sub(" ", s)) or words & forbidden:
                dropped.append(s)
            else:
                keep.append(" ".join(s.split()))
        if keep or not line.strip():
            kept_lines.append(" ".join(keep) if sentences else line)
    return CleanedAnswer("\n".join(kept_lines).strip(), dropped)


class StreamGuard:
    """What of a streamed answer may be shown live: words are released once complete, and a word the
    sources hold only inside removed instruction text, or a link no source gave, is masked (the
    final answer, checked whole by `clean_answer`, then drops its sentence)."""

    def __init__(self, allowed_text: str, allowed_urls: list[str], removed: list[str], question: str = "") -> None:
        self._allowed, self._forbidden = _answer_rules(allowed_text, allowed_urls, removed, question)
        self._pending = ""

    def _safe(self, text: str) -> str:
        def word(m: re.Match) -> str:
            w = m.group(0)
            if any(not _url_allowed(url, self._allowed) for url in _URL.findall(w)) or "![" in w:
                return "…"
            if any(t.lower() in self._forbidden for t in _TOKEN.findall(w)):
                return "…"
            return w
        return re.sub(r"\S+", word, text)

    def feed(self, delta: str) -> str:
        self._pending += delta
        cut = max(self._pending.rfind(" "), self._pending.rfind("\n"))
        if cut < 0:
            return ""
        ready, self._pending = self._pending[: cut + 1], self._pending[cut + 1:]
        return self._safe(ready)

    def close(self) -> str:
        ready, self._pending = self._pending, ""
        return self._safe(ready)
