"""A 2-D map of the indexed papers: where each sits among the others, and the field's topic
clusters (how it is made and what it costs: docs/ui.md).

Papers (the mean of their chunks' vectors) are laid out with t-SNE, which best keeps each paper's
nearest neighbours near it, what a reader of a map looks at; clusters are k-means regions of the
layout, labelled by c-TF-IDF over titles. The map is cached in the store (`map.npz`); later papers
are placed among their nearest mapped ones without moving the rest, until REBUILD_SHARE is passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rag.errors import StoreError
from rag.metadata import paper_metadata

if TYPE_CHECKING:
    from rag.index.store import Store
    from rag.models import Answer, Source

FORMAT = 1  # bumped when the file's layout changes: a map of another format is laid out again
PCA_DIMS = 50
NEIGHBOURS = 10  # mapped papers an appended one is placed among
PLACE_BLOCK = 256  # papers placed per matrix product (256 x 100k similarities: 100 MB)
# Papers t-SNE lays out; any more are placed among them (see `layout`). Measured at 20k papers:
# t-SNE on all 60 s, on 5k + placing the rest 31 s, but the neighbours kept fall from 0.55 to 0.29;
# so t-SNE lays out every paper of any corpus this tool is meant for.
LAYOUT_SAMPLE = 200_000
REBUILD_SHARE = 0.25  # appended papers, as a share of the last full layout, that trigger a new one
MAX_CLUSTERS = 40
VECTOR_BATCH = 5_000  # chunk vectors read from Chroma at a time
LABEL_TERMS = 2
LABELS = 3  # how labels are made: a cached map with others is labelled again
SEED = 20260
ABSTRACTS_UP_TO = 20_000  # larger maps leave the abstracts out of the page (~1 kB each)
# Title words that name no topic (c-TF-IDF ranks them low anyway; these would still tie for first).
_GENERIC = frozenset(
    "learning learn model models neural network networks deep method methods approach approaches"
    " data towards toward new via based efficient large scale framework analysis improving improved"
    " beyond through under study problem problems task tasks general generalized robust simple fast"
    " better optimal novel should against when does can "
    "not more all any one two what how why".split()
)
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*")


@dataclass
class PaperMap:
    """The layout of one store's papers: coordinates in [-1, 1], a cluster per paper, cluster
    labels."""

    paper_ids: list[str]
    xy: np.ndarray  # (n, 2) float32
    cluster: np.ndarray  # (n,) int32, index into labels
    labels: list[str]
    centres: np.ndarray  # (k, 2) float32: cluster centres on the map
    mean: np.ndarray  # (d,) float32: the vectors' mean, for projecting new papers
    axes: np.ndarray  # (d, p) float32: the principal axes
    proj: np.ndarray  # (n, p) float32: the papers' unit-length projections
    last_rowid: int  # the newest chunk the map covers
    laid_out: int  # papers in the last full layout
    method: str  # "tsne" or "pca"
    seconds: float  # how long the last full layout took

    def __len__(self) -> int:
        return len(self.paper_ids)

    @property
    def appended(self) -> int:
        return len(self) - self.laid_out

    def save(self, path) -> None:
        tmp = path.with_name(path.name + ".tmp.npz")
        meta = {
            "format": FORMAT,
            "paper_ids": self.paper_ids,
            "labels": self.labels,
            "labels_made": LABELS,
            "last_rowid": self.last_rowid,
            "laid_out": self.laid_out,
            "method": self.method,
            "seconds": self.seconds,
        }
        try:
            np.savez(
                tmp,
                xy=self.xy,
                cluster=self.cluster,
                centres=self.centres,
                mean=self.mean,
                axes=self.axes,
                proj=self.proj.astype(np.float16),
                meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
            )
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(
                f"could not write the map to {path} ({exc.strerror}); free disk space or check the "
                "store's permissions"
            ) from None

    @classmethod
    def load(cls, path) -> PaperMap | None:
        """The cached map, or None when there is none, it is unreadable or of another format."""
        try:
            with np.load(path, allow_pickle=False) as f:
                meta = json.loads(f["meta"].tobytes().decode())
                if meta.get("format") != FORMAT:
                    return None
                return cls(
                    meta["paper_ids"],
                    f["xy"],
                    f["cluster"],
                    meta["labels"] if meta.get("labels_made") == LABELS else [],
                    f["centres"],
                    f["mean"],
                    f["axes"],
                    f["proj"].astype(np.float32),
                    meta["last_rowid"],
                    meta["laid_out"],
                    meta["method"],
                    meta["seconds"],
                )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def paper_map(store: Store, progress: Callable[[str], None] | None = None) -> PaperMap:
    """The store's map, up to date with its committed papers: the cached one, extended with the
    papers ingested since, or laid out afresh (no cache, another format, the store rebuilt, too much
    appended)."""
    say = progress or (lambda _msg: None)
    last = store.last_rowid()
    if last < 0:
        raise StoreError(
            f"the index at {store.dir} is empty; add papers with `rag ingest FILE...` first"
        )
    cached = PaperMap.load(store.map_path)
    if cached is not None and not _covers(cached, store, last):
        cached = None  # the store was rebuilt under it
    if cached is not None and not cached.labels:  # labelled the way an earlier version did
        cached = _replace(
            cached,
            labels=cluster_labels(
                cached.cluster, len(cached.centres), _titles(store, cached.paper_ids)
            ),
        )
        if cached.last_rowid == last:
            _keep(cached, store)
    if cached is not None and cached.last_rowid == last:
        return cached
    if cached is not None:
        rows = store.chunk_papers_after(cached.last_rowid)
        known = set(cached.paper_ids)
        fresh = {pid for _, _, pid in rows if pid not in known}
        if len(cached) + len(fresh) - cached.laid_out <= REBUILD_SHARE * cached.laid_out:
            say(f"placing {len(fresh):,} new papers on the map of {len(cached):,}")
            updated = _appended(cached, store, rows, fresh)
            _keep(updated, store)
            return updated
    rows = store.chunk_papers_after(-1)
    say(
        f"laying out the map of {len({pid for _, _, pid in rows}):,} papers (once; cached in the"
        " store)"
    )
    built = build_map(store, rows)
    _keep(built, store)
    return built


def paper_vectors(store: Store, rows: list[tuple[int, str, str]]) -> tuple[list[str], np.ndarray]:
    """Each paper's unit-length mean chunk vector, papers in order of first appearance."""
    ids: list[str] = []
    index: dict[str, int] = {}
    owner = np.empty(len(rows), np.int64)
    for i, (_, _, pid) in enumerate(rows):
        if pid not in index:
            index[pid] = len(ids)
            ids.append(pid)
        owner[i] = index[pid]
    sums: np.ndarray | None = None
    # a batch at a time: 137k vectors would be 210 MB
    for start in range(0, len(rows), VECTOR_BATCH):
        vectors = store.vectors([cid for _, cid, _ in rows[start : start + VECTOR_BATCH]])
        if sums is None:
            sums = np.zeros((len(ids), vectors.shape[1]), np.float32)
        np.add.at(sums, owner[start : start + VECTOR_BATCH], vectors)
    return ids, _unit(sums if sums is not None else np.zeros((0, 0), np.float32))


def build_map(store: Store, rows: list[tuple[int, str, str]]) -> PaperMap:
    start = time.perf_counter()
    ids, vectors = paper_vectors(store, rows)
    mean, axes, proj = principal_axes(vectors, PCA_DIMS)
    xy, method = layout(proj)
    cluster, centres = clusters(xy)
    labels = cluster_labels(cluster, len(centres), _titles(store, ids))
    return PaperMap(
        ids,
        xy,
        cluster,
        labels,
        centres,
        mean,
        axes,
        _unit(proj),
        max(r[0] for r in rows),
        len(ids),
        method,
        round(time.perf_counter() - start, 2),
    )


def principal_axes(vectors: np.ndarray, dims: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, top `dims` principal axes (d x p) and the projections of the vectors on them."""
    mean = vectors.mean(axis=0)
    centred = vectors - mean
    # The d x d covariance is small (384 x 384): its eigenvectors cost milliseconds at any n.
    values, vecs = np.linalg.eigh(centred.T @ centred)
    axes = vecs[:, np.argsort(values)[::-1][: min(dims, vectors.shape[1])]].astype(np.float32)
    return mean.astype(np.float32), axes, (centred @ axes).astype(np.float32)


def layout(proj: np.ndarray, sample: int | None = LAYOUT_SAMPLE) -> tuple[np.ndarray, str]:
    """2-D coordinates in [-1, 1] for the projected papers, and the method used. Over `sample`
    papers, t-SNE lays out a random `sample` of them and the others are placed among their nearest
    (see `place`): t-SNE's time grows faster than the papers (bench/speed/map_layout.py measures
    both ways)."""
    n = len(proj)
    if n < 20:  # t-SNE needs a few dozen points to mean anything
        return _fit_box(
            proj[:, :2] if proj.shape[1] >= 2 else np.pad(proj, ((0, 0), (0, 2 - proj.shape[1])))
        ), "pca"
    units = _unit(proj)
    if sample is not None and n > sample:
        chosen = np.sort(np.random.default_rng(SEED).choice(n, sample, replace=False))
        xy = np.empty((n, 2), np.float32)
        xy[chosen] = _tsne(units[chosen])
        rest = np.setdiff1d(np.arange(n), chosen, assume_unique=True)
        xy[rest] = place(units[rest], units[chosen], xy[chosen])[0]
        return _fit_box(xy), f"tsne on {sample:,} + placed"
    return _fit_box(_tsne(units)), "tsne"


def _tsne(units: np.ndarray) -> np.ndarray:
    from openTSNE import TSNE

    n = len(units)
    tsne = TSNE(
        perplexity=min(30.0, (n - 1) / 3.5),
        initialization="pca",
        metric="euclidean",
        n_jobs=os.cpu_count() or 1,
        random_state=SEED,
        neighbors="exact" if n < 2000 else "annoy",
        negative_gradient_method="bh" if n < 10_000 else "fft",
        verbose=False,
    )
    return np.asarray(tsne.fit(units), dtype=np.float32)


def place(
    units: np.ndarray, ref_units: np.ndarray, ref_xy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Map positions for papers not laid out: each at the similarity-weighted mean of its NEIGHBOURS
    most similar reference papers (the nearest dominate). Returns the positions and, per paper,
    those neighbours' indices and weights (for a cluster vote). Blocked: memory stays ~BLOCK x
    references."""
    k = min(NEIGHBOURS, len(ref_units))
    xy = np.empty((len(units), 2), np.float32)
    near = np.empty((len(units), k), np.int64)
    weights = np.empty((len(units), k), np.float32)
    for start in range(0, len(units), PLACE_BLOCK):
        block = slice(start, start + PLACE_BLOCK)
        sims = units[block] @ ref_units.T
        idx = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        w = np.maximum(np.take_along_axis(sims, idx, axis=1), 1e-3) ** 4
        xy[block] = (w[:, :, None] * ref_xy[idx]).sum(1) / w.sum(1, keepdims=True)
        near[block], weights[block] = idx, w
    return xy, near, weights


def clusters(xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """k-means on the map: each paper's cluster and the clusters' centres (largest cluster
    first)."""
    n = len(xy)
    k = max(1, min(MAX_CLUSTERS, round(np.sqrt(n) / 2)))
    if k == 1:
        return np.zeros(n, np.int32), xy.mean(axis=0, keepdims=True).astype(np.float32)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=k, n_init=3, random_state=SEED).fit(xy)
    order = np.argsort(-np.bincount(km.labels_, minlength=k), kind="stable")
    rank = np.empty(k, np.int32)
    rank[order] = np.arange(k, dtype=np.int32)
    return rank[km.labels_], km.cluster_centers_[order].astype(np.float32)


def cluster_labels(cluster: np.ndarray, k: int, titles: Iterable[str]) -> list[str]:
    """Each cluster's LABEL_TERMS most distinctive title phrases (c-TF-IDF over runs of one to
    three words: "time series · forecasting", not "series · time · forecasting"), as the titles
    spell them; phrases that share a word with one already chosen are passed over, and so is a last
    phrase that would give a cluster the label of a larger one."""
    counts: list[Counter] = [Counter() for _ in range(k)]
    spelled: dict[str, Counter] = defaultdict(Counter)
    for c, title in zip(cluster.tolist(), titles):
        seen = set()
        for key, phrase in _phrases(title):
            if key not in seen:
                seen.add(key)
                counts[c][key] += 1
                spelled[key][phrase] += 1
    total: Counter = Counter()
    for c in counts:
        total.update(c)
    words_per_cluster = max(1.0, sum(total.values()) / max(1, k))
    labels = []
    used: set[frozenset[str]] = set()
    for c in counts:
        size = max(1, sum(c.values()))

        def score(t: str, c: Counter = c, size: int = size) -> float:
            # A longer phrase names a topic better than its words do one by one.
            distinct = (c[t] / size) * np.log(1 + words_per_cluster / total[t])
            return distinct * (1 + 0.5 * t.count(" "))

        chosen: list[str] = []
        shared = 2 if c and max(c.values()) > 1 else 1  # a phrase of one title names no cluster
        for term in sorted(c, key=lambda t: (-score(t), t)):
            if c[term] < shared:
                continue
            words = set(term.split())
            overlap = [other for other in chosen if words & set(other.split())]
            if not overlap:
                # the last phrase makes a label no larger cluster has
                last = len(chosen) == LABEL_TERMS - 1
                if len(chosen) < LABEL_TERMS and not (last and frozenset([*chosen, term]) in used):
                    chosen.append(term)
            elif all(set(o.split()) < words and 2 * c[term] >= c[o] for o in overlap):
                # "gradient descent" for "gradient · descent": half the titles with one say both
                chosen = [term if o == overlap[0] else o for o in chosen if o not in overlap[1:]]
        used.add(frozenset(chosen))
        labels.append(" · ".join(spelled[t].most_common(1)[0][0] for t in chosen) or "untitled")
    return labels


def _phrases(title: str) -> list[tuple[str, str]]:
    """(stemmed key, spelling) of every run of one to three adjacent title words between stop
    words, none starting with a word that names no topic (`_GENERIC`): "spiking neural networks",
    not "large language"."""
    from rag.text import STOPWORDS, stem

    out: list[tuple[str, str]] = []
    run: list[str] = []
    for word in [*_WORD.findall(title), "the"]:
        low = word.lower()
        if len(low) >= 3 and low not in STOPWORDS:
            run.append(word)
            continue
        for n in (1, 2, 3):
            for i in range(len(run) - n + 1):
                gram = run[i : i + n]
                if gram[0].lower() in _GENERIC:
                    continue
                out.append(
                    (
                        " ".join(stem(w.lower()) for w in gram),
                        " ".join(
                            w if any(ch.isupper() for ch in w[1:]) else w.lower() for w in gram
                        ),
                    )
                )
        run = []
    return out


def trustworthiness_share(
    vectors: np.ndarray,
    xy: np.ndarray,
    k: int = 10,
    pool: int = 50,
    sample: int | None = None,
    seed: int = SEED,
) -> float:
    """The share of each paper's k nearest neighbours on the map that are among its `pool` nearest
    by embedding (cosine), averaged over the papers (or over `sample` of them, drawn at random): 1.0
    when the map keeps every neighbourhood."""
    n = len(vectors)
    units = _unit(vectors)
    xy = np.asarray(xy, dtype=np.float32)
    rows = (
        np.arange(n)
        if sample is None or sample >= n
        else np.sort(np.random.default_rng(seed).choice(n, sample, replace=False))
    )
    hits = 0
    for start in range(0, len(rows), 512):
        block = rows[start : start + 512]
        sims = units[block] @ units.T
        sims[np.arange(len(block)), block] = -np.inf
        near = np.argpartition(-sims, pool, axis=1)[:, :pool]
        d = ((xy[block, None, :] - xy[None, :, :]) ** 2).sum(-1)
        d[np.arange(len(block)), block] = np.inf
        map_near = np.argpartition(d, k, axis=1)[:, :k]
        hits += sum(len(set(a) & set(b)) for a, b in zip(map_near.tolist(), near.tolist()))
    return hits / (len(rows) * k)


def map_data(
    store: Store, pmap: PaperMap, answer: Answer | None = None, abstracts: bool | None = None
) -> dict:
    """What the map page draws (see rag/paper_map/page.py): every mapped paper (titles and abstracts
    with their LaTeX as Unicode text), the clusters, and the answer's cited and retrieved papers
    when one is given. Abstracts are left out of maps over ABSTRACTS_UP_TO papers unless `abstracts`
    says."""
    where = {pid: i for i, pid in enumerate(pmap.paper_ids)}
    n = len(pmap)
    with_abstracts = n <= ABSTRACTS_UP_TO if abstracts is None else abstracts
    cols: dict[str, list] = {
        k: [""] * n for k in ("ids", "titles", "authors", "years", "venues", "urls")
    }
    cols["ids"] = list(pmap.paper_ids)
    texts = [""] * n if with_abstracts else None
    for paper, abstract in store.all_papers(abstracts=with_abstracts):
        i = where.get(paper.paper_id)
        if i is None:
            continue
        meta = paper_metadata(paper)  # the year and venue every other surface shows
        cols["titles"][i] = _readable(paper.display_title)
        cols["authors"][i] = ", ".join(meta.authors)
        cols["years"][i] = meta.year or ""
        cols["venues"][i] = meta.venue or ""
        cols["urls"][i] = meta.url or ""
        if texts is not None:
            texts[i] = _readable(abstract or "")
    sizes = np.bincount(pmap.cluster, minlength=len(pmap.labels))
    data = {
        "title": f"Map of {n:,} papers",
        "papers": {
            **cols,
            "abstracts": texts,
            "x": np.round(pmap.xy[:, 0], 4).tolist(),
            "y": np.round(pmap.xy[:, 1], 4).tolist(),
            "cluster": pmap.cluster.tolist(),
        },
        "clusters": [
            {"label": label, "x": round(float(c[0]), 4), "y": round(float(c[1]), 4), "size": int(s)}
            for label, c, s in zip(pmap.labels, pmap.centres, sizes)
        ],
    }
    if answer is not None:
        data["highlight"] = highlight_of(answer.sources)
        data["question"] = answer.question
    return data


def highlight_of(sources: list[Source]) -> dict:
    """An answer's papers as the map lights them: cited, and retrieved but not cited."""
    cited = list(dict.fromkeys(s.paper_id for s in sources if s.cited))
    retrieved = [pid for pid in dict.fromkeys(s.paper_id for s in sources) if pid not in cited]
    return {"cited": cited, "retrieved": retrieved}


# ---- helpers -----------------------------------------------------------------------------------


def _appended(
    pmap: PaperMap, store: Store, rows: list[tuple[int, str, str]], fresh: set[str]
) -> PaperMap:
    new_rows = [r for r in rows if r[2] in fresh]
    if not new_rows:  # only new abstracts of mapped papers: they keep their place
        return _replace(pmap, last_rowid=rows[-1][0])
    ids, vectors = paper_vectors(store, new_rows)
    proj = _unit((vectors - pmap.mean) @ pmap.axes)
    xy, near, weights = place(proj, pmap.proj, pmap.xy)
    votes = np.zeros((len(ids), len(pmap.centres)))
    np.add.at(
        votes,
        (np.repeat(np.arange(len(ids)), near.shape[1]), pmap.cluster[near].ravel()),
        weights.ravel(),
    )
    return _replace(
        pmap,
        paper_ids=pmap.paper_ids + ids,
        xy=np.vstack([pmap.xy, xy]),
        cluster=np.concatenate([pmap.cluster, votes.argmax(1).astype(np.int32)]),
        proj=np.vstack([pmap.proj, proj]),
        last_rowid=rows[-1][0],
    )


def _covers(pmap: PaperMap, store: Store, last: int) -> bool:
    """The cached map is of this store's chunks: its newest chunk is still there, a paper it
    maps."""
    if pmap.last_rowid > last:
        return False
    row = store.chunks_by_rowid([pmap.last_rowid]).get(pmap.last_rowid)
    return row is not None and row.paper_id in set(pmap.paper_ids)


def _keep(pmap: PaperMap, store: Store) -> None:
    """Cache the map in the store when it can be written: a read-only store still shows its map
    (laid out again by the next process)."""
    with contextlib.suppress(StoreError):
        pmap.save(store.map_path)


def _readable(text: str) -> str:
    """Inline LaTeX as Unicode text ("$R^2=1$" -> "R²=1"): the page shows text only (see
    rag/latex.py)."""
    if "$" not in text and "\\" not in text:
        return text
    from rag.latex import to_text

    return to_text(text)


def _replace(pmap: PaperMap, **changes) -> PaperMap:
    return PaperMap(**{**pmap.__dict__, **changes})


def _titles(store: Store, ids: list[str]) -> list[str]:
    titles = {paper.paper_id: paper.display_title for paper, _ in store.all_papers(abstracts=False)}
    return [titles.get(pid, "") for pid in ids]


def _unit(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


def _fit_box(xy: np.ndarray) -> np.ndarray:
    """Centred and scaled so the farthest point is at distance 1 on an axis (the page zooms from
    there)."""
    xy = np.asarray(xy, dtype=np.float32)
    xy = xy - (xy.max(0) + xy.min(0)) / 2
    return (xy / max(float(np.abs(xy).max()), 1e-12)).astype(np.float32)
