"""A BM25 keyword index in plain numpy, persisted as one `.npz` file and loaded, never rebuilt per query.

Postings are stored term by term (CSR over terms), each with its precomputed BM25 weight,
so a query is a handful of vectorised additions.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from collections.abc import Iterable
from itertools import repeat
from pathlib import Path

import numpy as np

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[-'][A-Za-z0-9]+)*")
# Bumped whenever `tokenize` changes: an index saved in another format is rebuilt, not misread.
FORMAT = 2
STOPWORDS = frozenset(
    "a an and are as at be by can do does for from has have how i in into is it its of on or our "
    "that the their them these they this those to was we were what when where which while who why "
    "with within without you your about than then there such via using use used paper papers".split()
)


def _stem(token: str) -> str:
    # A light plural/suffix fold: "models" ~ "model", "learning" stays (too lossy to strip).
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 3 and token.endswith("s") and not token.endswith(("ss", "us", "is")):
        return token[:-1]
    return token


def tokenize(text: str) -> list[str]:
    tokens = []
    for word in _TOKEN.findall(text):
        tok = word.lower()
        if tok in STOPWORDS:
            continue
        # An acronym's final S is one of its letters: PACS is not PAC, while LLMs are LLMs.
        tokens.append(tok if len(word) > 2 and word.isupper() else _stem(tok))
        if "-" in tok:  # "in-context" also matches "in context" and "incontext"
            tokens.extend(_stem(p) for p in tok.split("-") if p and p not in STOPWORDS)
            tokens.append(tok.replace("-", ""))
    return tokens


_WORD = re.compile(r"[A-Za-z0-9][\w-]*")


_COMPARED_NAME = re.compile(
    r"\b(?:like|unlike|than|versus|vs\.?|beyond|against|over|(?:similar|compared|relative|analogous) (?:to|with)"
    r"|instead of|such as|rather than)\s+([A-Za-z0-9][\w-]*)", re.I)


# Words that make a name into an adjective ("GRPO-style", "LLM-based"): not part of the name.
_NAME_AFFIXES = frozenset("style like based free aware level wise guided driven only scale type".split())


def name_like_words(text: str) -> list[str]:
    """Words written like names: with a digit, an inner capital (NAVI, FedARC, Mamba2), or
    capitalised anywhere but at the start of a sentence (Palimpsa)."""
    out = []
    for m in _WORD.finditer(text):
        word = m.group(0)
        before = text[:m.start()].rstrip()
        sentence_start = not before or before[-1] in ".?!:\"'("
        if any(c.isdigit() for c in word) or any(c.isupper() for c in word[1:]) or (
                word[0].isupper() and not sentence_start):
            out.append(word)
    return out


class KeywordIndex:
    """BM25 (k1=1.2, b=0.75) over a list of documents identified by integer keys."""

    def __init__(self, vocab: dict[str, int], offsets: np.ndarray, docs: np.ndarray,
                 weights: np.ndarray, keys: np.ndarray) -> None:
        self.vocab, self.offsets, self.docs, self.weights, self.keys = vocab, offsets, docs, weights, keys

    @classmethod
    def build(cls, rows: Iterable[tuple[int, str]], k1: float = 1.2, b: float = 0.75) -> KeywordIndex:
        """Index `(key, text)` rows, read one at a time.

        Postings accumulate in typed arrays (4 bytes an entry, not a Python int in a list): at 100k
        abstracts there are ~15M of them, which as lists would take over a gigabyte.
        """
        vocab: dict[str, int] = {}
        keys, lengths = array("q"), array("f")
        doc_ids, term_ids, tfs = array("i"), array("i"), array("f")
        for d, (key, text) in enumerate(rows):
            counts: dict[int, int] = {}
            toks = tokenize(text)
            for t in toks:
                tid = vocab.setdefault(t, len(vocab))
                counts[tid] = counts.get(tid, 0) + 1
            keys.append(key)
            lengths.append(len(toks))
            doc_ids.extend(repeat(d, len(counts)))
            term_ids.extend(counts.keys())
            tfs.extend(counts.values())
        n_docs, n_terms = max(len(keys), 1), len(vocab)
        t_arr = np.frombuffer(term_ids, dtype=np.int32)
        df = np.bincount(t_arr, minlength=n_terms)  # documents per term
        idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        offsets = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=offsets[1:])
        length = np.frombuffer(lengths, dtype=np.float32)
        avg = max(float(length.mean()) if len(keys) else 1.0, 1e-9)
        # BM25 weights, computed in place: at 100k abstracts each temporary is ~50 MB.
        d_arr = np.frombuffer(doc_ids, dtype=np.int32)
        tf = np.frombuffer(tfs, dtype=np.float32)
        denom = length[d_arr]
        denom *= k1 * b / avg
        denom += k1 * (1 - b)
        denom += tf
        w = tf * (k1 + 1)
        w /= denom
        del denom
        w *= idf[t_arr]
        order = np.argsort(t_arr, kind="stable")
        del t_arr, term_ids, tfs, tf
        docs = d_arr[order]
        del d_arr, doc_ids
        weights = w[order]
        del w, order
        return cls(vocab, offsets, docs, weights, np.frombuffer(keys, dtype=np.int64).copy())

    def __len__(self) -> int:
        return len(self.keys)

    def search(self, query: str, n: int) -> list[tuple[int, float]]:
        """The best `n` (key, bm25 score) pairs for the query, best first."""
        scores = np.zeros(len(self.keys), dtype=np.float32)
        hit = False
        for tok in set(tokenize(query)):
            tid = self.vocab.get(tok)
            if tid is None:
                continue
            lo, hi = self.offsets[tid], self.offsets[tid + 1]
            scores[self.docs[lo:hi]] += self.weights[lo:hi]
            hit = True
        if not hit:
            return []
        n = min(n, int((scores > 0).sum()))
        top = np.argpartition(-scores, n - 1)[:n] if n < len(scores) else np.arange(len(scores))
        top = top[np.argsort(-scores[top], kind="stable")][:n]
        return [(int(self.keys[i]), float(scores[i])) for i in top]

    def rare_term_keys(self, query: str, paper_of, max_papers: int) -> set[int]:
        """Keys of documents holding a name the query uses that few papers use.

        A question that names something (a method name such as "Palimpsa" or "FedARC") found in
        only a few papers is about those papers, however low their embedding similarity.
        `paper_of(keys)` gives the papers of document keys: papers are counted, not chunks, as one
        paper may have several chunks and several versions of its abstract.
        """
        keys: set[int] = set()
        for name in name_like_words(query):
            for tok in set(tokenize(name)):
                tid = self.vocab.get(tok)
                if tid is None or len(tok) <= 2:
                    continue
                lo, hi = self.offsets[tid], self.offsets[tid + 1]
                if hi - lo > 8 * max_papers:  # common enough without counting (and without a lookup)
                    continue
                docs = [int(self.keys[d]) for d in self.docs[lo:hi]]
                if len(set(paper_of(docs))) <= max_papers:
                    keys.update(docs)
        return keys

    def unknown_names(self, query: str) -> list[str]:
        """Names the query asks about (see name_like_words) that no indexed text contains: "HyperZeta-Net",
        "word2vec" in a corpus without them. Numbers are not names (an absent number says nothing),
        nor is a name the question only compares with ("like X", "than X", "compared to X")."""
        unknown = []
        compared = {m.group(1) for m in _COMPARED_NAME.finditer(query)}
        for name in dict.fromkeys(name_like_words(query)):
            if name in compared:  # "like DreamBooth but for crystals" asks about another paper
                continue
            tokens = tokenize(name)
            if not tokens or name[0].isdigit():  # "2026", "5.27", "2x", "7B": amounts, not names
                continue
            if len(name) <= 2:  # "U" of "U.S.", "Go": too short to say a corpus lacks it
                continue
            if tokens[0] in self.vocab or name.lower().replace("-", "") in self.vocab:
                continue
            # "S-SPPO" is known when the text spells it "$\textit{S}$-SPPO": every part is there.
            parts = [t[0] for t in map(tokenize, name.split("-"))
                     if t and not t[0].isdigit() and t[0] not in _NAME_AFFIXES]
            if parts and all(p in self.vocab for p in parts):
                continue
            unknown.append(name)
        return unknown

    def save(self, path: Path) -> None:
        """Write atomically: a reader sees the old file or the new one, never half of one."""
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, format=np.int64(FORMAT), offsets=self.offsets, docs=self.docs, weights=self.weights,
                     keys=self.keys, vocab=np.frombuffer(json.dumps(self.vocab).encode("utf-8"), dtype=np.uint8))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> KeywordIndex:
        with np.load(path) as z:
            if "format" not in z.files or int(z["format"]) != FORMAT:
                raise ValueError(f"{path} was written by another version of the keyword tokenizer")
            vocab = json.loads(z["vocab"].tobytes().decode("utf-8"))
            return cls(vocab, z["offsets"], z["docs"], z["weights"], z["keys"])
