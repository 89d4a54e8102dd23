"""Ingest: corpus files -> records -> chunks -> vectors -> store, resumable and idempotent."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .chunking import abstract_hash, split_record
from .corpus import Record, expand_paths, parse_file
from .errors import CorpusError
from .models import IngestReport
from .store import Chunk, Store

PAPERS_PER_BATCH = 64
# With stderr not a terminal (nohup, CI, a log file) there is no bar: a line this often instead, so
# that an ingest of an hour is not silent until its summary.
PROGRESS_INTERVAL_S = 30.0


def read_records(paths: list[Path]) -> tuple[list[Record], IngestReport]:
    """Parse every file first: a bad file stops the ingest before anything is written."""
    report = IngestReport()
    records: list[Record] = []
    files = expand_paths(paths)
    if not files:
        raise CorpusError(f"no corpus files found in {', '.join(map(str, paths))}; pass .txt, .jsonl or .csv files")
    for path in files:
        parsed = parse_file(path)
        report.files.append(str(path))
        report.records += len(parsed.records) + parsed.skipped
        report.skipped_no_abstract += parsed.skipped
        records.extend(parsed.records)
    return records, report


def pending_records(store: Store, records: list[Record], report: IngestReport) -> list[tuple[Record, str, bool]]:
    """The records not indexed yet, as (record, abstract hash, first abstract of a new paper)."""
    known = store.known_abstracts()
    known_papers = {pid for pid, _ in known}
    seen: dict[tuple[str, str], str] = {}  # abstracts of this run -> where first read
    todo: list[tuple[Record, str, bool]] = []
    for rec in records:
        key = (rec.paper_id, abstract_hash(rec.abstract))
        if key in known:
            report.already_indexed += 1
            continue
        if key in seen:  # the same abstract twice in this run is one, and a repeat in the input
            report.duplicates += 1
            report.duplicate_example = report.duplicate_example or f"{rec.source} repeats {seen[key]}"
            continue
        seen[key] = rec.source
        todo.append((rec, key[1], rec.paper_id not in known_papers))
        known_papers.add(rec.paper_id)
    return todo


def index_records(store: Store, embedder, todo: list[tuple[Record, str, bool]], report: IngestReport,
                  chunk_size: int, chunk_overlap: int, max_tokens: int, progress: bool = True) -> IngestReport:
    """Chunk, embed and write `todo` in batches of whole papers (the caller holds the store's lock).

    `todo` is emptied once everything is written: at 100k abstracts the records take hundreds of
    megabytes that the keyword-index build can then reuse.

    Three stages overlap: the next batch is chunked and the previous one written while this one is
    embedded (the model and Chroma release the GIL, so on 2 cores this hides most of the rest).
    Batches are still committed one after another, in order, each in its own transaction: a kill
    leaves whole papers only, and a re-run picks up after the last commit.
    """
    if not todo:
        if store.keyword_index_stale():  # e.g. killed after its last commit, before the keyword save
            store.rebuild_keyword_index()
        return report
    store.init_meta(embedder.model_id)
    batches = [todo[i:i + PAPERS_PER_BATCH] for i in range(0, len(todo), PAPERS_PER_BATCH)]

    def prepare(batch):
        papers, chunks = [], []
        for rec, ahash, _ in batch:
            texts = split_record(rec, chunk_size, chunk_overlap, embedder.count_tokens, max_tokens)
            # Every record's row, not only new papers': a second source may fill in a missing title.
            papers.append(rec.paper())
            for seq, text in enumerate(texts):
                chunks.append(Chunk(f"{rec.paper_id}:{ahash}:{seq}", rec.paper_id, ahash, seq, text, rec.abstract))
        return papers, chunks

    bar = _progress(len(todo), progress)
    prep_pool, write_pool = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    writing = None
    try:
        preparing = prep_pool.submit(prepare, batches[0])
        # While the first batch is chunked (its thread loads the tokenizer), open Chroma on the writer
        # thread and load the model here: at 76 abstracts these fixed costs are most of the ingest.
        opening = write_pool.submit(store.collection)
        embedder.count_tokens(["warm-up"])
        opening.result()
        for i, batch in enumerate(batches):
            papers, chunks = preparing.result()
            if i + 1 < len(batches):
                preparing = prep_pool.submit(prepare, batches[i + 1])
            vectors = embedder.embed([c.text for c in chunks])
            if writing is not None:
                _account(writing.result(), report, bar)
            writing = write_pool.submit(_write, store, batch, papers, chunks, vectors)
        assert writing is not None  # batches is never empty here
        _account(writing.result(), report, bar)
        writing = None
        todo.clear()
        del batches, batch, papers, chunks, vectors
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
    store.rebuild_keyword_index()
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
            print(f"rag: ingest: {self.done}/{self.total} abstracts ({100 * self.done // self.total}%), "
                  f"{_duration(elapsed)} elapsed, ~{_duration(left)} left", file=sys.stderr, flush=True)
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
