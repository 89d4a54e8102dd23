"""A BM25 keyword index in plain numpy: an inverted index in segments, memory-mapped from the
store, appended to by each ingest (never rebuilt), and queried through the postings of the
question's terms only.

Postings are stored term by term (CSR over a sorted vocabulary) as raw term frequencies; BM25's
weights are computed for the query's postings at query time, from collection statistics kept
exact by every append. Kept by hand because bm25s rebuilds: at 137k chunks adding 100 takes 0.03 s
here against its 16.6 s (docs/performance.md).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Container, Iterable
from itertools import islice, repeat
from pathlib import Path

import numpy as np

from rag.text import (
    COMPARED_NAME,
    KEYWORD_STEMMERS,
    abstract_words,
    keyword_terms,
    keyword_terms_with,
)

# Bumped whenever `rag.text.keyword_terms` changes: an index saved in another format is rebuilt, not
# misread.
FORMAT = 3
K1, B = 1.2, 0.75
# Documents (chunks) per segment: bounds the memory of building one and the work of a small append
# (which rewrites at most the last segment); a query looks its terms up in each of them.
SEGMENT_DOCS = 32_768
MAX_TF = 65_535  # term frequencies are stored as uint16
LOOKUP_BLOCK = 32  # terms per block of the in-memory vocabulary sample (see Segment.find)


_WORD = re.compile(r"[A-Za-z0-9][\w-]*")
_LETTERS = re.compile(r"[a-z]{2,}")


# Words that make a name into an adjective ("BERT-style", "LLM-based"): not part of the name.
_NAME_AFFIXES = frozenset(
    "style like based free aware level wise guided driven only scale type".split()
)


def name_like_words(text: str, common: Container[str] | None = None) -> list[str]:
    """Words written like names: with a digit, an inner capital (BERT, LoRA, ResNet50), or
    capitalised anywhere but at the start of a sentence (Adam). With `common` (a question is read
    with the words ML abstracts write, `rag.text.abstract_words`), a capitalised word starting a
    sentence is a name too when a part of it is none of those words ("Palimpsa?"; not "Tell me")."""
    out = []
    for m in _WORD.finditer(text):
        word = m.group(0)
        before = text[max(0, m.start() - 64) : m.start()].rstrip()  # not the whole text: linear
        sentence_start = not before or before[-1] in ".?!:\"'("
        if (
            any(c.isdigit() for c in word)
            or any(c.isupper() for c in word[1:])
            or (word[0].isupper() and not sentence_start)
            or (
                word[0].isupper()
                and common is not None
                and any(part not in common for part in _LETTERS.findall(word.lower()))
            )
        ):
            out.append(word)
    return out


class Segment:
    """The postings of consecutive documents, immutable once built: its vocabulary sorted (UTF-8
    bytes in one blob), each term's postings (local document numbers and term frequencies) in a
    CSR layout, and each document's key and length. On disk, one directory of `.npy` files that is
    memory-mapped: opening an index reads none of it, a query reads the pages of its terms."""

    ARRAYS = ("keys", "lengths", "terms", "term_starts", "post_starts", "docs", "tfs")

    def __init__(
        self,
        keys: np.ndarray,
        lengths: np.ndarray,
        terms: np.ndarray,
        term_starts: np.ndarray,
        post_starts: np.ndarray,
        docs: np.ndarray,
        tfs: np.ndarray,
        name: str | None = None,
    ) -> None:
        self.keys, self.lengths, self.terms, self.term_starts = keys, lengths, terms, term_starts
        self.post_starts, self.docs, self.tfs = post_starts, docs, tfs
        self.name = name  # its directory's name once written
        self.tokens = int(lengths.sum(dtype=np.int64))
        self._lookup: tuple[bytes, list[int], list[bytes]] | None = None  # see find

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def n_terms(self) -> int:
        return len(self.term_starts) - 1

    @classmethod
    def build(cls, rows: Iterable[tuple[int, str]], terms=keyword_terms) -> Segment:
        """A segment of `(key, text)` rows, read one at a time, `terms` splitting each text.

        Postings accumulate in typed arrays (a few bytes an entry, not a Python int in a list)."""
        vocab: dict[str, int] = {}
        keys, lengths = array("q"), array("i")
        doc_ids, term_ids, tfs = array("i"), array("i"), array("H")
        for d, (key, text) in enumerate(rows):
            counts: dict[int, int] = {}
            toks = terms(text)
            for t in toks:
                tid = vocab.setdefault(t, len(vocab))
                counts[tid] = counts.get(tid, 0) + 1
            keys.append(key)
            lengths.append(len(toks))
            doc_ids.extend(repeat(d, len(counts)))
            term_ids.extend(counts.keys())
            tfs.extend(min(c, MAX_TF) for c in counts.values())
        encoded = [t.encode("utf-8") for t in vocab]
        order = sorted(range(len(encoded)), key=encoded.__getitem__)
        rank = np.empty(len(encoded), dtype=np.int32)
        rank[np.asarray(order, dtype=np.int64)] = np.arange(len(encoded), dtype=np.int32)
        t_arr = rank[np.frombuffer(term_ids, dtype=np.int32)]
        del term_ids
        return cls._assemble(
            np.frombuffer(keys, dtype=np.int64).copy(),
            np.frombuffer(lengths, dtype=np.int32).copy(),
            [encoded[i] for i in order],
            t_arr,
            np.frombuffer(doc_ids, dtype=np.int32),
            np.frombuffer(tfs, dtype=np.uint16),
        )

    @classmethod
    def merge(cls, segments: list[Segment]) -> Segment:
        """One segment holding these segments' documents, in order: their postings are combined, no
        text is tokenized again."""
        vocab = sorted({t for s in segments for t in s.term_list()})
        index = {t: i for i, t in enumerate(vocab)}
        t_parts, d_parts, base = [], [], 0
        for s in segments:
            ids = np.fromiter((index[t] for t in s.term_list()), dtype=np.int32, count=s.n_terms)
            t_parts.append(np.repeat(ids, np.diff(s.post_starts)))
            d_parts.append(np.asarray(s.docs) + base)
            base += len(s)
        return cls._assemble(
            np.concatenate([s.keys for s in segments]),
            np.concatenate([s.lengths for s in segments]),
            vocab,
            np.concatenate(t_parts),
            np.concatenate(d_parts),
            np.concatenate([s.tfs for s in segments]),
        )

    @classmethod
    def _assemble(cls, keys, lengths, vocab: list[bytes], term_ids, doc_ids, tfs) -> Segment:
        """Sort postings by term (stable: each term's documents stay in order) into the CSR
        layout."""
        order = np.argsort(term_ids, kind="stable")
        docs, tf = (
            doc_ids[order].astype(np.int32, copy=False),
            tfs[order].astype(np.uint16, copy=False),
        )
        post_starts = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum(np.bincount(term_ids, minlength=len(vocab)), out=post_starts[1:])
        del order
        term_starts = np.zeros(len(vocab) + 1, dtype=np.int64)
        np.cumsum([len(t) for t in vocab], out=term_starts[1:])
        blob = np.frombuffer(b"".join(vocab), dtype=np.uint8).copy()
        return cls(keys, lengths, blob, term_starts, post_starts, docs, tf)

    def term_list(self) -> list[bytes]:
        blob, starts = self.terms.tobytes(), self.term_starts.tolist()
        return [blob[starts[i] : starts[i + 1]] for i in range(self.n_terms)]

    def find(self, term: bytes) -> int:
        """The term's number in this segment, or -1.

        The vocabulary blob is read once (a few MB), with every LOOKUP_BLOCK-th term as a Python
        list: a term is found by bisecting that list, then the one block it falls in. Element by
        element access to the memory-mapped arrays cost ~50 us a lookup; this costs a few."""
        if self._lookup is None:
            blob = self.terms.tobytes()
            starts = self.term_starts[::LOOKUP_BLOCK].tolist()
            ends = self.term_starts[1::LOOKUP_BLOCK].tolist()
            self._lookup = blob, starts, [blob[a:b] for a, b in zip(starts, ends)]
        blob, _, heads = self._lookup
        block = bisect_right(heads, term) - 1
        if block < 0:
            return -1
        lo = block * LOOKUP_BLOCK
        bounds = self.term_starts[lo : min(lo + LOOKUP_BLOCK, self.n_terms) + 1].tolist()
        terms = [blob[a:b] for a, b in zip(bounds, bounds[1:])]
        i = bisect_left(terms, term)
        return lo + i if i < len(terms) and terms[i] == term else -1

    def postings(self, term: bytes) -> tuple[np.ndarray, np.ndarray] | None:
        """(local document numbers, term frequencies) of the term, or None."""
        tid = self.find(term)
        if tid < 0:
            return None
        lo, hi = int(self.post_starts[tid]), int(self.post_starts[tid + 1])
        return self.docs[lo:hi], self.tfs[lo:hi]

    def write(self, directory: Path) -> Segment:
        """Write to `directory` (atomically: a temporary directory renamed) and return the segment
        memory-mapped from there."""
        tmp = directory.with_name(directory.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in self.ARRAYS:
            with open(tmp / f"{name}.npy", "wb") as fh:
                np.save(fh, np.ascontiguousarray(getattr(self, name)))
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, directory)
        return Segment.open(directory)

    @classmethod
    def open(cls, directory: Path) -> Segment:
        # Plain ndarray views of the maps: np.memmap's own indexing costs microseconds a call.
        arrays = {
            name: np.asarray(np.load(directory / f"{name}.npy", mmap_mode="r"))
            for name in cls.ARRAYS
        }
        return cls(**arrays, name=directory.name)


class KeywordIndex:
    """BM25 (k1=1.2, b=0.75) over documents identified by increasing integer keys (chunk rowids),
    held in segments.

    Only raw counts are stored (term frequencies, document lengths): the weights, which depend on
    the whole collection (document count, average length, each term's document frequency), are
    computed at query time for the query's postings alone. So appending documents is writing a new
    segment, and the scores after any number of appends are those of a full rebuild.
    """

    def __init__(self, segments: list[Segment], stemmer: str = "light") -> None:
        self.segments = segments
        # one of rag.text.KEYWORD_STEMMERS: how documents and queries are split
        self.stemmer = stemmer
        self.terms = keyword_terms_with(stemmer)
        self.bases = [0]
        for s in segments:
            self.bases.append(self.bases[-1] + len(s))
        self.n_docs = self.bases[-1]
        tokens = sum(s.tokens for s in segments)
        self.avg_length = max(tokens / self.n_docs if self.n_docs else 1.0, 1e-9)
        self._norms: np.ndarray | None = None

    def _norms_all(self) -> np.ndarray:
        """k1 x (1 - b + b x length / average length) of every document, once per index (the average
        changes with every append): 4 bytes a document."""
        if self._norms is None:
            norm = (
                np.concatenate([s.lengths for s in self.segments])
                if self.segments
                else np.zeros(0, np.int32)
            ).astype(np.float32)
            norm *= K1 * B / self.avg_length
            norm += K1 * (1 - B)
            self._norms = norm
        return self._norms

    @classmethod
    def build(
        cls, rows: Iterable[tuple[int, str]], directory: Path | None = None, stemmer: str = "light"
    ) -> KeywordIndex:
        """Index `(key, text)` rows (keys increasing); see `appended`."""
        return cls([], stemmer).appended(rows, directory)

    def appended(
        self, rows: Iterable[tuple[int, str]], directory: Path | None = None
    ) -> KeywordIndex:
        """A new index: this one plus `(key, text)` rows, whose keys must be above `last_key`.

        Rows are read one at a time into segments of at most SEGMENT_DOCS documents; with a
        `directory`, each is written there as soon as it is built and memory-mapped back, so that
        memory is bounded by one segment, not the corpus. Trailing segments that fit together are
        merged (postings only), so a small append rewrites one small segment, never the index.
        """
        segments = list(self.segments)
        it = iter(rows)
        while True:
            segment = Segment.build(islice(it, SEGMENT_DOCS), self.terms)
            if not len(segment):
                break
            if segments and segment.keys[0] <= segments[-1].keys[-1]:
                raise ValueError("keyword index: appended keys must follow the indexed ones")
            segments.append(segment)
            while len(segments) >= 2 and len(segments[-2]) + len(segments[-1]) <= SEGMENT_DOCS:
                segments[-2:] = [Segment.merge(segments[-2:])]
            if directory is not None and segments[-1].name is None:
                segments[-1] = segments[-1].write(directory / f"seg-{secrets.token_hex(6)}")
        return KeywordIndex(segments, self.stemmer)

    def __len__(self) -> int:
        return self.n_docs

    @property
    def last_key(self) -> int:
        return int(self.segments[-1].keys[-1]) if self.n_docs else -1

    @property
    def keys(self) -> np.ndarray:
        return (
            np.concatenate([s.keys for s in self.segments])
            if self.segments
            else np.zeros(0, np.int64)
        )

    def _key(self, doc: int) -> int:
        i = bisect_right(self.bases, doc) - 1
        return int(self.segments[i].keys[doc - self.bases[i]])

    def postings(self, term: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(segment number, local documents, frequencies) of the term in every segment holding
        it."""
        encoded = term.encode("utf-8")
        out = []
        for i, s in enumerate(self.segments):
            found = s.postings(encoded)
            if found is not None:
                out.append((i, *found))
        return out

    def rare_keys(self, word: str, limit: int) -> list[int]:
        """Keys of the documents that hold `word` (its first term) when at most `limit` do, else
        none."""
        tokens = self.terms(word)
        found = self.postings(tokens[0]) if tokens else []
        if sum(len(local) for _, local, _ in found) > limit:
            return []
        return [int(k) for i, local, _ in found for k in self.segments[i].keys[local]]

    def __contains__(self, term: str) -> bool:
        encoded = term.encode("utf-8")
        return any(s.find(encoded) >= 0 for s in self.segments)

    def _scores(self, query: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """BM25 of every document for the query (zero where no query term occurs) and, per query
        term met, the global numbers of the documents holding it. Terms are added in sorted order,
        so the float32 sums, and ties, are the same in every process (set order follows the hash
        seed)."""
        scores = np.zeros(self.n_docs, dtype=np.float32)
        norm = self._norms_all()
        met: list[np.ndarray] = []
        for tok in sorted(set(self.terms(query))):
            found = self.postings(tok)
            if not found:
                continue
            # Global document numbers (a copy out of the memory maps) and frequencies, all segments
            # at once.
            where = np.concatenate([docs + self.bases[i] for i, docs, _ in found])
            tf = np.concatenate([tfs for _, _, tfs in found]).astype(np.float32)
            df = len(where)
            idf = np.float32(np.log(1.0 + (self.n_docs - df + 0.5) / (df + 0.5)))
            denom = norm[where]
            denom += tf
            w = tf * (K1 + 1)
            w /= denom
            w *= idf
            scores[where] += w  # a document occurs once in a term's postings
            met.append(where)
        return scores, met

    def scores_of(self, query: str, keys: Iterable[int]) -> dict[int, float]:
        """The BM25 score of each of these documents for the query (0.0: no query term in it, or
        not indexed), for showing beside results that another list ranked."""
        keys = list(keys)
        if not self.n_docs or not keys:
            return dict.fromkeys(keys, 0.0)
        scores, _ = self._scores(query)
        out = {}
        for key in keys:
            doc = self._doc(key)
            out[key] = 0.0 if doc is None else float(scores[doc])
        return out

    def _doc(self, key: int) -> int | None:
        """The global document number of a key, or None when it is not indexed."""
        for i, s in enumerate(self.segments):
            if len(s) and int(s.keys[0]) <= key <= int(s.keys[-1]):
                pos = int(np.searchsorted(s.keys, key))
                return self.bases[i] + pos if pos < len(s) and int(s.keys[pos]) == key else None
        return None

    def search(self, query: str, n: int) -> list[tuple[int, float]]:
        """The best `n` (key, bm25 score) pairs for the query, best first (ties: lower key first).

        Touches the postings of the query's terms only: scores are added into one array over all
        documents (zeroed, never scanned), candidates are the documents met, and the top `n` of
        those are selected, then sorted.
        """
        if not self.n_docs or n <= 0:
            return []
        scores, met = self._scores(query)
        if not met:
            return []
        cand = np.concatenate(met)  # a document once per query term holding it
        vals = scores[cand]
        if n * len(met) < len(cand):
            # The n x terms best entries hold at least n documents, and every document tied with
            # the n-th best (ties go to the lower key).
            cut = len(vals) - n * len(met)
            keep = vals >= np.partition(vals, cut)[cut]
            cand = cand[keep]
        cand = np.unique(cand)
        vals = scores[cand]
        order = np.lexsort((cand, -vals))[:n]
        return [(self._key(int(cand[i])), float(vals[i])) for i in order]

    def rare_term_keys(self, query: str, paper_of, max_papers: int) -> set[int]:
        """Keys of documents holding a name the query uses that few papers use.

        A question that names something (a method name such as "AlexNet" or "LoRA") found in
        only a few papers is about those papers, however low their embedding similarity.
        `paper_of(keys)` gives the papers of document keys: papers are counted, not chunks, as one
        paper may have several chunks and several versions of its abstract.
        """
        keys: set[int] = set()
        for name in name_like_words(query, abstract_words()):
            for tok in set(self.terms(name)):
                if len(tok) <= 2:
                    continue
                found = self.postings(tok)
                if not found or sum(len(d) for _, d, _ in found) > 8 * max_papers:
                    continue  # absent, or common enough without counting (and without a lookup)
                docs = [int(self.segments[i].keys[d]) for i, local, _ in found for d in local]
                if len(set(paper_of(docs))) <= max_papers:
                    keys.update(docs)
        return keys

    def unknown_names(self, query: str) -> list[str]:
        """Names the query asks about (see name_like_words) that no indexed text contains:
        "AlexNet", "GloVe" in a corpus without them. Numbers are not names (an absent
        number says nothing), nor is a name the question only compares with ("like X", "than X",
        "compared to X")."""
        unknown = []
        compared = {m.group(1) for m in COMPARED_NAME.finditer(query)}
        for name in dict.fromkeys(name_like_words(query, abstract_words())):
            if name in compared:  # "like AlexNet but for audio" asks about another paper
                continue
            tokens = self.terms(name)
            if not tokens or name[0].isdigit():  # "2026", "5.27", "2x", "7B": amounts, not names
                continue
            if len(name) <= 2:  # "U" of "U.S.", "Go": too short to say a corpus lacks it
                continue
            if tokens[0] in self or name.lower().replace("-", "") in self:
                continue
            # "X-Net" is known when the text spells it "$\textit{X}$-Net": every part is there.
            parts = [
                t[0]
                for t in map(self.terms, name.split("-"))
                if t and not t[0].isdigit() and t[0] not in _NAME_AFFIXES
            ]
            if parts and all(p in self for p in parts):
                continue
            unknown.append(name)
        return unknown

    # ---- on disk -------------------------------------------------------------------------------
    # <store>/keyword.json lists the segments (<store>/keyword/seg-*/): it is replaced atomically
    # after the segments it names are written, so a reader sees a whole index, old or new.

    def save(self, manifest: Path) -> None:
        """Write the segments not written yet and then the manifest; remove segment directories the
        manifest no longer names (merged away, or left by a killed ingest)."""
        directory = manifest.with_suffix("")
        segments = [
            s if s.name else s.write(directory / f"seg-{secrets.token_hex(6)}")
            for s in self.segments
        ]
        self.segments = segments
        body = {
            "format": FORMAT,
            "stemmer": self.stemmer,
            "docs": self.n_docs,
            "last_key": self.last_key,
            "segments": [{"name": s.name, "docs": len(s)} for s in segments],
        }
        tmp = manifest.with_name(manifest.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(body, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, manifest)
        keep = {s.name for s in segments}
        if directory.is_dir():
            for path in directory.iterdir():
                if path.name not in keep:
                    shutil.rmtree(path, ignore_errors=True)

    @classmethod
    def load(cls, manifest: Path) -> KeywordIndex:
        """The index a manifest names, memory-mapped. ValueError: another format, or not whole."""
        try:
            body = json.loads(manifest.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{manifest} is not a keyword index manifest ({exc})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError(f"{manifest} was written by another version of the keyword tokenizer")
        directory = manifest.with_suffix("")
        segments = [Segment.open(directory / s["name"]) for s in body["segments"]]
        # indexes written before stemmers were recorded: light
        stemmer = body.get("stemmer", "light")
        if stemmer not in KEYWORD_STEMMERS:
            raise ValueError(f"{manifest} names an unknown keyword stemmer {stemmer!r}")
        index = cls(segments, stemmer)
        if index.n_docs != body["docs"] or index.last_key != body["last_key"]:
            raise ValueError(f"{manifest} does not match its segments")
        return index
