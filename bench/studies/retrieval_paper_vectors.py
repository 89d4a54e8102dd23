"""Finished study: per-paper vectors gained nothing; not kept
(bench/results/retrieval_paper_vectors_minilm.json).

One vector per paper beside the chunk vectors, on one store: does a paper's whole-abstract vector
find the paper a paraphrase describes better than its best chunk does?

    python -m bench.studies.retrieval_paper_vectors --store DIR [--questions FILE ...] [--vectors
FILE.npz] [--json OUT]

A paraphrase describes the whole paper, while a chunk (240 tokens with the title) holds part of an
abstract that is longer: 9,105 chunks for 5,871 papers. Dense lists, each ranking papers: `chunk`
the store's chunk search (a paper by its best chunk, as shipped), `mean` the normalized mean of the
paper's chunk vectors (no new embedding), `whole` title and abstract embedded as one text (truncated
to the model's window; embedded once, cached in `--vectors`), and blends of a paper's best-chunk and
whole/mean similarities. Each is fused with the store's BM25 list by rank (the shipped constants,
the rare-name list at weight 1) and by an even convex blend of min-max scaled scores. Questions and
their tuning / held-out split as in bench.retrieval.variants.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.helpers import machine_load
from bench.retrieval.common import (
    DEPTH,
    arguments,
    finish,
    gold_questions,
    minmax,
    new_result,
    record,
)


def chunk_vectors(store):
    """Every chunk's vector and paper id, from the store's Chroma collection."""
    import numpy as np

    collection = store.collection()
    vecs, papers, offset = [], [], 0
    while True:
        got = collection.get(include=["embeddings"], limit=2000, offset=offset)
        if not got["ids"]:
            break
        rowids = store.rowids_for_chunk_ids(got["ids"])
        rows = store.chunks_by_rowid([rowids[i] for i in got["ids"]])
        papers += [rows[rowids[i]].paper_id for i in got["ids"]]
        vecs.append(np.asarray(got["embeddings"], dtype=np.float32))
        offset += len(got["ids"])
    return np.concatenate(vecs), np.asarray(papers)


def paper_vectors(rag, path: Path):
    """Per paper: the mean of its chunk vectors and its title + abstract embedded whole; cached in
    `path`."""
    import numpy as np

    if path.exists():
        z = np.load(path)
        return z["ids"], z["mean"], z["whole"]
    vecs, owner_ids = chunk_vectors(rag.store)
    ids, owner = np.unique(owner_ids, return_inverse=True)
    mean = np.zeros((len(ids), vecs.shape[1]), dtype=np.float32)
    np.add.at(mean, owner, vecs)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    texts = dict(
        (paper.paper_id, f"{paper.title}\n{abstract or ''}")
        for paper, abstract in rag.store.all_papers()
    )
    started = time.perf_counter()
    ordered = [texts[str(i)] for i in ids]
    whole = np.asarray(
        [
            v
            for s in range(0, len(ordered), 128)
            for v in rag.embedder.embed(ordered[s : s + 128], truncate=True)
        ],
        dtype=np.float32,
    )
    print(
        f"embedded {len(ordered)} whole abstracts in {time.perf_counter() - started:.0f} s"
        f" ({machine_load()})"
    )
    np.savez(path, ids=ids, mean=mean, whole=whole)
    return ids, mean, whole


def lists_for(rag, questions: list[dict], paper_vecs) -> list[dict]:
    import numpy as np

    from rag.retrieve.search import RARE_NAME_MAX_PAPERS

    ids, mean, whole = paper_vecs
    ids = [str(i) for i in ids]
    store, index = rag.store, rag.store.keyword_index()
    out = []
    for q in questions:
        vq = np.asarray(rag.embedder.embed_query(q["question"]), dtype=np.float32)
        dense = store.dense_search(vq.tolist(), 10 * DEPTH) or []
        keyword = index.search(q["question"], DEPTH)
        rare = set(
            index.rare_term_keys(
                q["question"],
                lambda i: [c.paper_id for c in store.chunks_by_rowid(i).values()],
                RARE_NAME_MAX_PAPERS,
            )
        )
        paper_of = {
            r: c.paper_id
            for r, c in store.chunks_by_rowid(list({r for r, _ in dense + keyword})).items()
        }
        best_chunk: dict[str, float] = {}
        for r, s in dense:
            if r in paper_of:
                best_chunk.setdefault(paper_of[r], s)
        kw: dict[str, float] = {}
        for r, s in keyword:
            if r in paper_of:
                kw.setdefault(paper_of[r], s)
        sim_mean, sim_whole = mean @ vq, whole @ vq
        scores = {
            "chunk": best_chunk,
            "mean": {ids[i]: float(sim_mean[i]) for i in np.argsort(-sim_mean)[:DEPTH]},
            "whole": {ids[i]: float(sim_whole[i]) for i in np.argsort(-sim_whole)[:DEPTH]},
        }
        pos = {p: i for i, p in enumerate(ids)}
        pool = set(list(best_chunk)[:DEPTH]) | set(scores["whole"]) | set(scores["mean"])
        floor = min(best_chunk.values()) if best_chunk else 0.0
        for name, sims in (("whole", sim_whole), ("mean", sim_mean)):
            for w in (0.3, 0.5):
                scores[f"chunk+{name} {w}"] = {
                    p: (1 - w) * best_chunk.get(p, floor) + w * float(sims[pos[p]])
                    for p in pool
                    if p in pos
                }
        out.append(
            {
                "q": q,
                "scores": scores,
                "keyword": kw,
                "rare": {paper_of[r] for r in rare if r in paper_of},
            }
        )
    return out


def ranked(scores: dict[str, float]) -> list[str]:
    return sorted(scores, key=lambda p: -scores[p])[:DEPTH]


def fuse_rrf(c: dict, dense: str, k: int = 60) -> list[str]:
    fused: dict[str, float] = {}
    keyword = ranked(c["keyword"])
    for ranking in (ranked(c["scores"][dense]), keyword, [p for p in keyword if p in c["rare"]]):
        for rank, p in enumerate(ranking):
            fused[p] = fused.get(p, 0.0) + 1.0 / (k + rank + 1)
    return ranked(fused)


def fuse_convex(c: dict, dense: str, w: float = 0.5) -> list[str]:
    def scaled(s: dict[str, float]) -> dict[str, float]:
        return minmax(sorted(s.items(), key=lambda x: -x[1])[:DEPTH])

    d, b = scaled(c["scores"][dense]), scaled(c["keyword"])
    return ranked(
        {
            p: w * d.get(p, 0.0)
            + (1 - w) * b.get(p, 0.0)
            + (1.0 if p in c["rare"] and p in b else 0.0)
            for p in d.keys() | b.keys()
        }
    )


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument(
        "--vectors",
        type=Path,
        default=Path("paper_vectors.npz"),
        help="the papers' mean and whole-abstract vectors (made when missing)",
    )
    args = ap.parse_args()

    from rag import RAG

    questions = [
        q
        for q in gold_questions(args.questions)
        if q["kind"] in ("paraphrase", "keyword", "numeric")
    ]
    rag = RAG(store_dir=args.store, llm="none")
    cands = lists_for(rag, questions, paper_vectors(rag, args.vectors))
    result = new_result(rag, args.store)
    for dense in cands[0]["scores"]:
        for fusion, order_of in (
            ("dense alone", lambda c, d=dense: ranked(c["scores"][d])),
            ("rrf", lambda c, d=dense: fuse_rrf(c, d)),
            ("convex 0.5", lambda c, d=dense: fuse_convex(c, d)),
        ):
            record(result, f"{dense} / {fusion}", cands, order_of, f"{dense:18} {fusion:12}")
    return finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
