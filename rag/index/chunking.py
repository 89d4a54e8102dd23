"""Splitting abstracts into chunks that fit the embedding model's window.

A port of LlamaIndex's `SentenceSplitter` (paragraphs, then sentences, phrases, words; chunks merged
up to the size with a token overlap) that imports neither LlamaIndex nor NLTK, whose imports took
half of a small ingest: sentences come from `rag.text.split_sentences`. Tokens are counted with an
offline tiktoken encoding (the default one is downloaded at first use). The title goes into every
chunk's embedded text; authors never do.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from rag.index.corpus import Record
from rag.text import count_tiktoken, normalize_text, split_sentences

PARAGRAPH_SEPARATOR = "\n\n\n"
# A phrase and the marks that end it. LlamaIndex's "[^,.;]+[,.;]?" drops the second of two marks
# ("e.g.," loses its comma); this keeps every character.
_PHRASE = re.compile(r"[^,.;\u3002]+[,.;\u3002]*|[,.;\u3002]+")


def _keep_separator(text: str, separator: str) -> list[str]:
    parts = text.split(separator)
    return [p for p in (separator + s if i else s for i, s in enumerate(parts)) if p]


@dataclass(frozen=True)
class _Split:
    text: str
    is_sentence: bool
    tokens: int


class SentenceSplitter:
    """Chunks of at most `chunk_size` tokens, preferring whole sentences, then whole phrases;
    consecutive chunks share up to `chunk_overlap` tokens of whole splits (LlamaIndex's algorithm).
    """

    def __init__(self, chunk_size: int, chunk_overlap: int) -> None:
        if chunk_overlap > chunk_size:
            raise ValueError(
                f"chunk overlap ({chunk_overlap}) is larger than the chunk size ({chunk_size})"
            )
        self.chunk_size, self.chunk_overlap = chunk_size, chunk_overlap

    def split_text(self, text: str, reserved: str = "") -> list[str]:
        """Chunks of `text`, leaving room in each for `reserved` (the title that is prepended)."""
        size = self.chunk_size - (count_tiktoken(reserved) if reserved else 0)
        if size <= 0:
            raise ValueError(
                f"{reserved[:40]!r} does not fit in a chunk of {self.chunk_size} tokens"
            )
        if not text:
            return []
        return self._merge(self._split(text, size), size)

    def _split(self, text: str, size: int) -> list[_Split]:
        tokens = count_tiktoken(text)
        if tokens <= size:
            return [_Split(text, True, tokens)]
        parts, is_sentence = _keep_separator(text, PARAGRAPH_SEPARATOR), True
        if len(parts) <= 1:
            parts = split_sentences(text)
        if len(parts) <= 1:
            is_sentence = False
            for split in (_PHRASE.findall, lambda t: _keep_separator(t, " "), list):
                parts = split(text)
                if len(parts) > 1:
                    break
        out: list[_Split] = []
        for part in parts:
            tokens = count_tiktoken(part)
            if tokens <= size or len(parts) == 1:  # one indivisible unit: _merge reports it
                out.append(_Split(part, is_sentence, tokens))
            else:
                out.extend(self._split(part, size))
        return out

    def _merge(self, splits: list[_Split], size: int) -> list[str]:
        chunks: list[str] = []
        current: list[_Split] = []
        length, new_chunk = 0, True

        def close() -> None:
            nonlocal current, length, new_chunk
            chunks.append("".join(s.text for s in current))
            last, current, length, new_chunk = current, [], 0, True
            for s in reversed(last):  # carry whole splits from the end as the overlap
                if length + s.tokens > self.chunk_overlap:
                    break
                current.insert(0, s)
                length += s.tokens

        i = 0
        while i < len(splits):
            split = splits[i]
            if split.tokens > size:
                raise ValueError("a single token is longer than the chunk size")
            if length + split.tokens > size and not new_chunk:
                close()
                continue
            while new_chunk and current and length + split.tokens > size:
                length -= current.pop(0).tokens  # drop overlap to make room
            if split.is_sentence or length + split.tokens <= size or new_chunk:
                current.append(split)
                length += split.tokens
                i += 1
                new_chunk = False
            else:
                close()
        if not new_chunk:
            chunks.append("".join(s.text for s in current))
        return [c.strip() for c in chunks if c.strip()]


@functools.lru_cache(maxsize=8)
def _splitter(chunk_size: int, chunk_overlap: int) -> SentenceSplitter:
    return SentenceSplitter(chunk_size, min(chunk_overlap, chunk_size // 4))


def chunk_text(title: str, piece: str) -> str:
    return f"{title}\n{piece}" if title else piece


def abstract_hash(abstract: str) -> str:
    return hashlib.sha1(normalize_text(abstract).encode("utf-8")).hexdigest()[:12]


def split_record(
    record: Record, chunk_size: int, chunk_overlap: int, count_tokens, max_tokens: int
) -> list[str]:
    """The embedded texts of one record: title + piece of abstract, each within `max_tokens`.

    `count_tokens` counts in the embedder's own tokenizer; when a chunk is over its window
    (tiktoken and word pieces disagree) the record is split again, smaller.
    """
    title = record.display_title
    size = chunk_size
    while True:
        splitter = _splitter(size, chunk_overlap)
        title_tokens = count_tiktoken(title) + 1 if title else 0
        if title_tokens > size // 2:
            # an absurdly long "title" would crowd out the abstract; keep the abstract whole
            title = ""
            continue
        pieces = splitter.split_text(record.abstract, title)
        texts = [chunk_text(title, p) for p in pieces if p.strip()]
        if not texts:
            return []
        if max(count_tokens(texts)) <= max_tokens or size <= 48:
            return texts
        size = int(size * 0.8)
