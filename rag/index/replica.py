"""A store as a cache of a corpus on a Chroma server (`RAG_CHROMA_URL`).

On a server the chunks carry their text, and the first chunk of each abstract its paper's metadata
(`rag.index.vectors.server_record`): the server is the corpus, and a store directory holds caches of
it (manifest, keyword index, map). `catch_up` brings them level, building them in an empty store and
adding only the missing chunks to one that fell behind; the server's state (the collection's id and
its number of chunks, which ingests only raise) takes one request per question.

The server is untrusted input (anyone who can reach it can write to it): every record is checked
(`check_record`) against what an ingest writes, with the ingest's limits; a record that fails is
skipped and named, never a traceback. The caches are never deleted because the server lost data: a
collection that is gone is not re-created (the caches answer), one made again without the mark of a
`--rebuild` leaves every cached paper in place, and `push_back` (`rag repair`) writes this store's
papers to the server again. A paper's title, authors and URL are those of the first abstract the
server holds under its id (docs/deploy.md, "What a replica trusts").
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rag.errors import StoreError
from rag.index.chunking import abstract_hash
from rag.index.corpus import MAX_ABSTRACT_CHARS, Paper, openreview_id
from rag.index.store import Chunk
from rag.index.vectors import ServerUnavailable

if TYPE_CHECKING:
    from rag.index.store import Store
    from rag.index.vectors import ChromaServer

# meta keys: the id of the server collection the caches were built from; the server's state
# (collection id, chunks) they were last level with; what the last catch-up skipped (JSON list);
# how many of this store's chunks the server lacked then.
SERVER_COLLECTION = "server_collection"
SERVER_SYNCED = "server_synced"
SERVER_SKIPPED = "server_skipped"
SERVER_MISSING = "server_missing"
ID_PAGE = 5000  # ids read per request
FETCH_BATCH = 500  # chunks (with text and metadata) read per request
# What an ingest can write, as limits on what is read back: an abstract is at most
# MAX_ABSTRACT_CHARS (rag/index/corpus.py); a chunk is a title and a piece of one abstract.
MAX_TITLE_CHARS = 2_000
MAX_CHUNK_CHARS = MAX_ABSTRACT_CHARS + MAX_TITLE_CHARS + 10
MAX_CHUNKS = 10_000  # chunks of one abstract (100,000 characters are ~100 chunks)
MAX_FIELD_CHARS = 2_000  # url, venue, year, label
MAX_AUTHORS_CHARS = 100_000
SKIPPED_KEPT = 100  # skipped records named in the manifest for `rag doctor`
_CHUNK_ID = re.compile(r"(.{1,500}):([0-9a-f]{12}):(0|[1-9][0-9]{0,4})", re.DOTALL)


@dataclass
class CatchUp:
    """What a catch-up did: abstracts and chunks added to the caches, whether they were set aside
    first (another store's --rebuild replaced the collection; `aside` says where they went), or kept
    though the collection was made again without that mark (`replaced`), abstracts skipped as
    incomplete on the server, records skipped as invalid (`skipped`: "chunk id: why"), the model
    claim ignored (`notes`), this store's chunks the server lacks, and the time it took."""

    abstracts: int = 0
    chunks: int = 0
    rebuilt: bool = False
    incomplete: int = 0
    without_text: int = 0
    seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    replaced: bool = False
    aside: str | None = None
    not_on_server: int = 0

    def warnings(self, collection: str, repair: str) -> list[str]:
        """One line per thing the user should know (the CLI prints them as warnings)."""
        out = list(self.notes)
        if self.skipped:
            named = "; ".join(self.skipped[:3]) + ("; ..." if len(self.skipped) > 3 else "")
            out.append(
                f"skipped {len(self.skipped)} invalid record(s) in Chroma collection "
                f"{collection!r} ({named}); `rag doctor` lists them"
            )
        if self.not_on_server:
            how = " was made again (the server lost it)" if self.replaced else " lacks them"
            out.append(
                f"Chroma collection {collection!r}{how}: {self.not_on_server:,} of this store's"
                f" chunks are not on the server (kept here); run `{repair}` to push them back"
            )
        return out


def _has_caches(store: Store) -> bool:
    with contextlib.suppress(StoreError):
        return store.exists() and store.last_rowid() >= 0
    return False


def catch_up(store: Store, embedding_model: str) -> CatchUp | None:
    """Bring the store's caches level with its collection on the server; None when there is nothing
    to do (no server, no such collection, already level, or another process is writing to this
    store). A server that cannot be read (down, slow, garbled) leaves a store with caches answering
    from them, the reason in `store.vectors_unavailable`; a store without caches gets the error."""
    server = store.server
    if server is None:
        return None
    try:
        state = server.state()
    except ServerUnavailable as exc:
        if _has_caches(store):
            store.vectors_unavailable = str(exc)
            return None
        raise
    if state is None or state == store.synced_state:
        return None  # gone: never re-created here; the caches answer (Store.dense_search says so)
    if store.exists() and _level(store, state):
        store.synced_state = state
        return None
    started = time.perf_counter()
    try:
        with store.writer():
            report = _catch_up(store, server, state, embedding_model)
    except ServerUnavailable as exc:
        if _has_caches(store):
            store.vectors_unavailable = str(exc)
            return None
        raise
    except StoreError as exc:
        if "another ingest is writing" in str(exc):
            return None  # that writer brings the store level; the next question looks again
        raise
    store.synced_state = state
    report.seconds = time.perf_counter() - started
    return report


def _level(store: Store, state: tuple[str, int]) -> bool:
    """Whether the caches were last level with this very state of the server."""
    synced = store.meta(SERVER_SYNCED)
    if synced is not None:
        return synced == json.dumps(list(state))
    # a store caught up before SERVER_SYNCED was recorded
    return store.meta(SERVER_COLLECTION) == state[0] and store.chunk_count() == state[1]


def _catch_up(
    store: Store, server: ChromaServer, state: tuple[str, int], embedding_model: str
) -> CatchUp:
    collection_id, _ = state
    report = CatchUp()
    recorded = store.meta(SERVER_COLLECTION) if store.exists() else None
    if recorded not in (None, collection_id) and store.chunk_count():
        mark = server.rebuilt_mark()
        if mark is not None:  # another store's --rebuild: follow it, the old caches kept aside
            report.aside = str(store.set_caches_aside())
            report.rebuilt = True
        else:  # made again after the server lost it: every cached paper stays
            report.replaced = True
    on_server = server.all_ids(ID_PAGE)
    have = store.chunk_ids() if store.exists() else set()
    # In the server's order (the order they were written): a paper's first abstract comes first.
    missing = [cid for cid in on_server if cid not in have]
    store.init_meta(_corpus_model(server, embedding_model, report))
    firsts: dict[str, Paper] = {}
    pending: dict[tuple[str, str], dict[int, tuple[str, str | None, dict]]] = {}
    bad: set[tuple[str, str]] = set()
    for start in range(0, len(missing), FETCH_BATCH):
        for cid, text, meta in server.records(missing[start : start + FETCH_BATCH]):
            checked = check_record(cid, text, meta)
            if isinstance(checked, str):
                report.skipped.append(f"{_shown(cid)}: {checked}")
                key = _key_of(cid)
                if key is not None:
                    bad.add(key)
                continue
            key, seq = checked
            if key not in bad:
                pending.setdefault(key, {})[seq] = (cid, text, meta)
        for key in bad:
            pending.pop(key, None)
        last = start + FETCH_BATCH >= len(missing)
        _commit_complete(store, pending, report, last, firsts)
    if not report.rebuilt:
        report.not_on_server = len(have - set(on_server))
    store.set_meta(SERVER_COLLECTION, collection_id)
    store.set_meta(SERVER_SYNCED, json.dumps(list(state)))
    store.set_meta(SERVER_SKIPPED, json.dumps(report.skipped[:SKIPPED_KEPT]))
    store.set_meta(SERVER_MISSING, str(report.not_on_server))
    store.update_keyword_index()
    return report


def _shown(cid: Any) -> str:
    text = " ".join(cid.split()) if isinstance(cid, str) else repr(cid)
    return text[:80] + ("…" if len(text) > 80 else "")


def _key_of(cid: Any) -> tuple[str, str] | None:
    m = _CHUNK_ID.fullmatch(cid) if isinstance(cid, str) else None
    return (m.group(1), m.group(2)) if m else None


def _corpus_model(server: ChromaServer, configured: str, report: CatchUp) -> str:
    """The model a new replica records: the one the collection names when it is a built-in model
    (the server cannot make this store load an arbitrary model, nor advise one), else the one
    configured."""
    from rag.backends.embedders import MODELS

    claim = server.corpus_model()
    if claim is None or claim == configured or claim in MODELS:
        return claim or configured
    report.notes.append(
        f"Chroma collection {server.name!r} names embedding model {claim[:80]!r}, which is not a"
        f" built-in one: ignored, this store uses {configured} (set RAG_EMBED_MODEL to change it)"
    )
    return configured


def check_record(cid: Any, text: Any, meta: Any) -> tuple[tuple[str, str], int] | str:
    """A record read from the server checked against what an ingest writes (`server_record`):
    ((paper id, abstract hash), seq), or why it is not valid, in a few words."""
    m = _key_of(cid)
    if m is None:
        return "its id is not paper-id:hash:seq"
    if not isinstance(meta, dict):
        return "it has no metadata"
    seq = int(cid.rsplit(":", 1)[1])
    if meta.get("paper_id") != m[0] or meta.get("abstract_hash") != m[1]:
        return "its paper_id or abstract_hash differs from its id"
    got_seq = meta.get("seq")
    if not isinstance(got_seq, int) or isinstance(got_seq, bool) or got_seq != seq:
        return f"its seq is {_value(got_seq)}, not {seq}"
    if text is not None and (not isinstance(text, str) or len(text) > MAX_CHUNK_CHARS):
        return "its text is not text of a chunk's length"
    if seq == 0:
        why = _check_head(m[0], m[1], meta)
        if why:
            return why
    return m, seq


def _value(v: Any) -> str:
    return repr(v)[:40]


def _check_head(paper_id: str, ahash: str, meta: dict) -> str | None:
    """The first chunk of an abstract carries the abstract and its paper's fields."""
    n = meta.get("n_chunks")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHUNKS:
        return f"its n_chunks is {_value(n)}"
    abstract = meta.get("abstract")
    if not isinstance(abstract, str) or not abstract.strip():
        return "it has no abstract"
    if len(abstract) > MAX_ABSTRACT_CHARS:
        return (
            f"its abstract has {len(abstract):,} characters, over the {MAX_ABSTRACT_CHARS:,} limit"
        )
    if abstract_hash(abstract) != ahash:
        return "its abstract does not match the hash in its id"
    for name, limit in (("title", MAX_TITLE_CHARS), ("label", MAX_FIELD_CHARS)):
        if not isinstance(meta.get(name, ""), str) or len(meta.get(name, "")) > limit:
            return f"its {name} is not text under {limit:,} characters"
    for name in ("url", "venue"):
        v = meta.get(name)
        if v is not None and (not isinstance(v, str) or len(v) > MAX_FIELD_CHARS):
            return f"its {name} is not text under {MAX_FIELD_CHARS:,} characters"
    year = meta.get("year")
    if year is not None and (isinstance(year, bool) or not isinstance(year, (str, int))):
        return f"its year is {_value(year)}"
    url = meta.get("url")
    if url is not None and not url.startswith(("https://", "http://")):
        return "its url is not http(s)"
    if url is not None and openreview_id(url) not in (None, paper_id):
        return "its url is another paper's OpenReview page"
    if _authors(meta.get("authors")) is None:
        return "its authors are not a JSON list of names"
    return None


def _authors(raw: Any) -> list[str] | None:
    if raw is None:
        return []
    if not isinstance(raw, str) or len(raw) > MAX_AUTHORS_CHARS:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        return None
    return value


def _same_title(a: str, b: str) -> bool:
    def fold(t: str) -> str:
        return " ".join(unicodedata.normalize("NFKC", t).casefold().split())

    return fold(a) == fold(b)


def _commit_complete(
    store: Store, pending: dict, report: CatchUp, last: bool, firsts: dict[str, Paper]
) -> None:
    """Write every abstract whose chunks have all arrived (an abstract whose first chunk says it has
    n); on the last batch, count what never completed (a killed ingest's vectors on the server).
    An abstract under a paper id the store (or an earlier abstract of this catch-up) already has
    must carry that paper's title: else it is not that paper's, and is skipped."""
    papers: list[Paper] = []
    chunks: list[Chunk] = []
    for key in list(pending):
        parts = pending[key]
        head = parts.get(0)
        n = head[2]["n_chunks"] if head else 0
        if head is not None and max(parts) >= n:
            del pending[key]
            report.skipped.append(f"{_shown(head[0])}: it has chunk {max(parts)} of {n}")
            continue
        if head is None or len(parts) < n:
            if last:
                report.incomplete += 1
                del pending[key]
            continue
        del pending[key]
        if any(parts[i][1] is None for i in range(n)):
            report.without_text += 1  # written by a version that kept only vectors on the server
            continue
        meta = head[2]
        year = meta.get("year")
        paper = Paper(
            key[0],
            meta.get("title", ""),
            meta.get("label", ""),
            _authors(meta.get("authors")) or [],
            meta.get("url"),
            meta.get("venue"),
            str(year) if year is not None else None,
        )
        first = firsts.get(key[0]) or store.papers([key[0]]).get(key[0])
        if first is not None and first.title and not _same_title(first.title, paper.title):
            report.skipped.append(
                f"{_shown(head[0])}: it is filed under paper {key[0]} ({first.title[:60]!r}) but"
                f" names another title ({paper.title[:60]!r})"
            )
            continue
        firsts.setdefault(key[0], paper)
        papers.append(paper)
        abstract = meta["abstract"]
        chunks.extend(
            Chunk(parts[i][0], key[0], key[1], i, parts[i][1], abstract) for i in range(n)
        )
        report.abstracts += 1
        report.chunks += n
    if chunks:
        store.add_rows(papers, chunks)


def push_back(store: Store, embedder, progress: bool = False) -> tuple[int, int]:
    """Write this store's abstracts that the server lacks (any of their chunks) back to its
    collection (made again if it is gone), re-embedding their chunk texts with `embedder`: after
    the server lost data, the caches are the copy that restores it. (papers, chunks) written. The
    caller holds the write lock."""
    server = store.server
    if server is None:
        raise StoreError("push_back needs a store on a Chroma server (RAG_CHROMA_URL)")
    on_server = set(server.all_ids(ID_PAGE)) if server.state() is not None else set()
    pushed_papers: set[str] = set()
    pushed = 0
    batch: list[Chunk] = []

    def flush() -> None:
        nonlocal pushed
        if not batch:
            return
        pids = sorted({c.paper_id for c in batch})
        papers = list(store.papers(pids).values())
        server.write(batch, embedder.embed([c.text for c in batch]), papers)
        pushed += len(batch)
        pushed_papers.update(pids)
        if progress:
            print(f"rag: pushed {pushed:,} chunks back to the server", flush=True)
        batch.clear()

    for abstract in store.abstracts_chunks():
        if all(c.chunk_id in on_server for c in abstract):
            continue
        batch.extend(abstract)  # whole abstracts: the first chunk says how many there are
        if len(batch) >= 256:
            flush()
    flush()
    store.register_replica(embedder.model_id)
    store.set_meta(SERVER_MISSING, "0")
    store.set_meta(SERVER_SYNCED, None)  # the next question checks the server again
    return len(pushed_papers), pushed
