"""Ingest: corpus files -> records -> chunks -> vectors -> store, resumable and idempotent."""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path

from rag.errors import CorpusError
from rag.index.chunking import abstract_hash, split_record
from rag.index.corpus import Record, expand_paths, iter_records
from rag.index.reading import DEFAULT_LIMITS, ReadLimits
from rag.index.store import Chunk, Store
from rag.models import IngestReport

PAPERS_PER_BATCH = 64
MALLOC_ARENAS = 2  # for `rag ingest`: see bound_malloc_arenas
# With stderr not a terminal (nohup, CI, a log file) there is no bar: a line this often instead, so
# that an ingest of an hour is not silent until its summary.
PROGRESS_INTERVAL_S = 30.0


def bound_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process, as MALLOC_ARENA_MAX does; called by `rag ingest`
    before its threads start. glibc gives each new thread an arena of its own (up to 8 per core),
    and the ingest's threads (reading, one embedding batch per core, writing, Chroma's) each kept
    freed batches in theirs: capped, peak RSS falls by a fifth or more at about the same speed
    (docs/performance.md). Not done for a Python app's `RAG.ingest`: the allocator is the app's to
    tune. Returns False (and does nothing) when MALLOC_ARENA_MAX is set or the C library is not
    glibc."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_arena_max = -8  # glibc's malloc.h
    return bool(mallopt(m_arena_max, arenas))


class Plan:
    """What an ingest will index, found by reading every file once: the new abstracts' keys (paper
    id, abstract hash), in order, each with whether it is its paper's first. Records are not kept:
    the files are read again as they are indexed, so memory is bounded by a batch, not the corpus.
    """

    def __init__(
        self, files: list[Path], report: IngestReport, limits: ReadLimits = DEFAULT_LIMITS
    ) -> None:
        self.files, self.report, self.limits = files, report, limits
        self.todo: dict[tuple[str, str], bool] = {}

    def __len__(self) -> int:
        return len(self.todo)

    def records(self) -> Iterator[tuple[Record, str, bool]]:
        """(record, abstract hash, first abstract of a new paper) of each abstract to index, in
        order."""
        for path in self.files:
            for rec in iter_records(path, self.limits):
                if rec is None:
                    continue
                key = (rec.paper_id, abstract_hash(rec.abstract))
                new = self.todo.pop(key, None)  # popped: a repeat in the input is indexed once
                if new is not None:
                    yield rec, key[1], new


def plan_ingest(
    paths: list[Path], known: set[tuple[str, str]], limits: ReadLimits = DEFAULT_LIMITS
) -> Plan:
    """Read every file through before anything is written (a bad file stops the ingest there),
    counting records and finding the abstracts not in `known` (the store's (paper id, hash)). Each
    read is bounded by `limits` (see `rag.index.reading.ReadLimits`)."""
    files = expand_paths(paths)
    if not files:
        raise CorpusError(
            f"no corpus files found in {', '.join(map(str, paths))}; pass .txt, .jsonl or .csv"
            " files"
        )
    plan = Plan(files, IngestReport(), limits)
    report = plan.report
    known_papers = {pid for pid, _ in known}
    seen: dict[tuple[str, str], str] = {}  # abstracts of this run -> where first read
    for path in files:
        report.files.append(str(path))
        for rec in iter_records(path, limits):
            report.records += 1
            if rec is None:
                report.skipped_no_abstract += 1
                continue
            key = (rec.paper_id, abstract_hash(rec.abstract))
            if key in known:
                report.already_indexed += 1
            # the same abstract twice in this run is one, and a repeat in the input
            elif key in seen:
                report.duplicates += 1
                report.duplicate_example = (
                    report.duplicate_example or f"{rec.source} repeats {seen[key]}"
                )
            else:
                seen[key] = rec.source
                plan.todo[key] = rec.paper_id not in known_papers
                known_papers.add(rec.paper_id)
    return plan


def index_records(
    store: Store,
    embedder,
    plan: Plan,
    chunk_size: int,
    chunk_overlap: int,
    max_tokens: int,
    progress: bool = True,
) -> IngestReport:
    """Chunk, embed and write the plan's records in batches of whole papers (the caller holds the
    store's lock), reading the files again as it goes.

    The next batch is read and chunked and the previous one written while this one is embedded
    (the model and Chroma release the GIL). Batches commit in order, each in its own transaction: a
    kill leaves whole papers only, and a re-run picks up after the last commit. The keyword index
    then gets the new chunks appended (see Store.update_keyword_index).
    """
    report = plan.report
    if store.settings.keyword_stemmer != "auto":
        # then rebuilt below, with no re-embedding
        store.use_keyword_stemmer(store.settings.keyword_stemmer)
    if not len(plan):
        # e.g. killed after its last commit, before the keyword save
        if store.keyword_index_stale():
            store.update_keyword_index()
        return report
    store.init_meta(embedder.model_id)
    pending = plan.records()

    def prepare():
        batch = list(islice(pending, PAPERS_PER_BATCH))
        papers, chunks = [], []
        for rec, ahash, _ in batch:
            texts = split_record(rec, chunk_size, chunk_overlap, embedder.count_tokens, max_tokens)
            # Every record's row, not only new papers': a second source may fill in a missing title.
            papers.append(rec.paper())
            for seq, text in enumerate(texts):
                chunks.append(
                    Chunk(
                        f"{rec.paper_id}:{ahash}:{seq}",
                        rec.paper_id,
                        ahash,
                        seq,
                        text,
                        rec.abstract,
                    )
                )
        return batch, papers, chunks

    bar = _progress(len(plan), progress)
    prep_pool, write_pool = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    writing = None
    try:
        preparing = prep_pool.submit(prepare)
        # While the first batch is read and chunked (its thread loads the tokenizer), open Chroma on
        # the writer thread and load the model here: at 76 abstracts these fixed costs are most of
        # the ingest.
        opening = write_pool.submit(store.vector_index.open)
        embedder.count_tokens(["warm-up"])
        opening.result()
        while True:
            batch, papers, chunks = preparing.result()
            if not batch:
                break
            preparing = prep_pool.submit(prepare)
            vectors = embedder.embed([c.text for c in chunks])
            if writing is not None:
                _account(writing.result(), report, bar)
            writing = write_pool.submit(_write, store, batch, papers, chunks, vectors)
        if writing is not None:
            _account(writing.result(), report, bar)
        writing = None
        del batch, papers, chunks
    finally:
        if writing is not None:  # an error above: let the batch in flight finish or fail, then stop
            try:
                writing.result()
            except Exception:
                pass
        prep_pool.shutdown(wait=True, cancel_futures=True)
        write_pool.shutdown(wait=True)
        if bar:
            bar.close()
    store.update_keyword_index()
    return report


def _write(store: Store, batch, papers, chunks, vectors) -> tuple[int, int, int]:
    store.add(papers, chunks, vectors)
    return len(batch), sum(new for _, _, new in batch), len(chunks)


def _account(done: tuple[int, int, int], report: IngestReport, bar) -> None:
    records, papers, chunks = done
    report.new_papers += papers
    report.new_chunks += chunks
    if bar:
        bar.update(records)


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    if not _is_terminal(sys.stderr):
        return _ProgressLines(total, PROGRESS_INTERVAL_S)
    from tqdm import tqdm

    return tqdm(total=total, unit="abstract", desc="indexing", file=sys.stderr, leave=False)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _ProgressLines:
    """Progress for a log: a bar's carriage returns pile up there, so a whole line every `interval`
    seconds while work remains (the summary on stdout says when it is done)."""

    def __init__(self, total: int, interval: float) -> None:
        self.total, self.interval, self.done = total, interval, 0
        self.start = self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.done >= self.total or now - self.last < self.interval:
            return
        self.last = now
        elapsed = now - self.start
        left = elapsed / self.done * (self.total - self.done)
        try:
            print(
                f"rag: ingest: {self.done}/{self.total} abstracts"
                f" ({100 * self.done // self.total}%), {_duration(elapsed)} elapsed,"
                f" ~{_duration(left)} left",
                file=sys.stderr,
                flush=True,
            )
        except (OSError, ValueError):  # a closed or full log must not stop the ingest
            pass

    def close(self) -> None:
        pass


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
