"""Pseudo-relevance feedback for either side of the hybrid search, measured on one store.

    python -m bench.retrieval_feedback --store DIR [--questions FILE ...] [--json OUT]

A first search (the candidates of bench/retrieval_variants.py: dense and BM25 top 100 chunks, fused)
names the top `k` chunks; they are taken as relevant and the question is searched again:
- **dense feedback** (Rocchio): the question's vector plus `beta` times the mean of those chunks'
  stored vectors, searched again in the store's vector index, then fused with the first BM25 list;
- **keyword feedback** (RM3): the terms of those chunks weighted by their share of each chunk, summed
  over the chunks with weights falling by rank; the best `m` terms not in the question join it, the
  question's terms keeping weight `1 - lam`; BM25 scored term by term with those weights, then fused
  with the first dense list;
- both at once.
Each on the light and the Snowball tokenizer, fused by the shipped rank fusion and by convex blends.
Figures as bench/retrieval_variants.py prints them (paraphrase tuning / held-out, keyword, numeric).
"""

from __future__ import annotations

import argparse
import functools
from collections import Counter
from pathlib import Path

import numpy as np

from bench.helpers import machine_load, write_json
from bench.retrieval_variants import (
    DEPTH,
    QUESTIONS,
    candidates,
    convex,
    figures_line,
    gold_questions,
    keyword_index,
    rrf,
    scores,
)


def _fused_rowids(c: dict, fuse: str) -> list[int]:
    """The first search's chunks in fused order (the shipped rank fusion, or convex at 0.5)."""
    if fuse == "rrf":
        fused: dict = {}
        for ranking in ([r for r, _ in c["dense"]], [r for r, _ in c["keyword"]]):
            for rank, r in enumerate(ranking):
                fused[r] = fused.get(r, 0.0) + 1.0 / (61 + rank)
    else:
        def scaled(hits):
            lo, hi = (min(s for _, s in hits), max(s for _, s in hits)) if hits else (0.0, 1.0)
            return {r: (s - lo) / (hi - lo) if hi > lo else 1.0 for r, s in hits}
        d, b = scaled(c["dense"]), scaled(c["keyword"])
        fused = {r: 0.5 * d.get(r, 0.0) + 0.5 * b.get(r, 0.0) for r in d.keys() | b.keys()}
    return sorted(fused, key=lambda r: -fused[r])


def dense_feedback(rag, c: dict, vector: np.ndarray, top: list[int], beta: float) -> list[tuple[int, float]]:
    store = rag.store
    chunk_ids = [row.chunk_id for row in store.chunks_by_rowid(top).values()]
    mean = store.vectors(chunk_ids).mean(axis=0)
    q = vector / np.linalg.norm(vector) + beta * mean / max(np.linalg.norm(mean), 1e-9)
    return store.dense_search((q / np.linalg.norm(q)).tolist(), DEPTH) or []


def keyword_feedback(rag, index, c: dict, top: list[int], m: int, lam: float) -> list[tuple[int, float]]:
    keyword_terms = index.terms
    question = Counter(keyword_terms(c["q"]["question"]))
    rows = rag.store.chunks_by_rowid(top)
    relevance: Counter = Counter()
    for rank, rowid in enumerate(top):
        terms = Counter(keyword_terms(rows[rowid].text))
        total = sum(terms.values()) or 1
        for t, n in terms.items():
            relevance[t] += (n / total) / (rank + 1)
    expansion = [t for t, _ in relevance.most_common() if t not in question and len(t) > 2][:m]
    weights = {t: (1 - lam) * n / sum(question.values()) for t, n in question.items()}
    norm = sum(relevance[t] for t in expansion) or 1.0
    for t in expansion:
        weights[t] = weights.get(t, 0.0) + lam * relevance[t] / norm
    scores_all = np.zeros(index.n_docs, np.float32)
    for t, w in weights.items():
        scores_all += w * _term_bm25(index, t)
    best = np.argsort(-scores_all)[:DEPTH]
    return [(index._key(int(d)), float(scores_all[d])) for d in best if scores_all[d] > 0]


def _term_bm25(index, term: str) -> np.ndarray:
    """One term's BM25 over every document (rag.index.keyword's formula)."""
    out = np.zeros(index.n_docs, np.float32)
    found = index.postings(term)
    if not found:
        return out
    where = np.concatenate([docs + index.bases[i] for i, docs, _ in found])
    tf = np.concatenate([tfs for _, _, tfs in found]).astype(np.float32)
    idf = np.log(1.0 + (index.n_docs - len(where) + 0.5) / (len(where) + 0.5))
    out[where] = idf * tf * (1.2 + 1) / (index._norms_all()[where] + tf)
    return out


FUSIONS = {
    "rrf": rrf,
    "convex 0.5": functools.partial(convex, dense_weight=0.5),
    "convex 0.65": functools.partial(convex, dense_weight=0.65),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, nargs="+", default=[p for p in QUESTIONS if p.exists()])
    ap.add_argument("--tokenizers", default="light,snowball")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from rag import RAG

    questions = gold_questions(args.questions)
    rag = RAG(store_dir=args.store, llm="none")
    result: dict = {"store": str(args.store), "papers": rag.store.paper_count(), "load": machine_load(), "variants": {}}
    for tokenizer in args.tokenizers.split(","):
        index = keyword_index(rag.store, tokenizer)
        cands = candidates(rag, questions, index)
        vectors = {id(c): np.asarray(rag.embedder.embed_query(c["q"]["question"]), np.float32) for c in cands}
        variants: dict[str, list[dict]] = {"none": cands}
        for first in ("rrf", "convex"):
            tops = {id(c): _fused_rowids(c, first) for c in cands}
            for k, beta in ((3, 0.5), (3, 1.0), (5, 0.5), (10, 0.5)):
                variants[f"dense PRF {first} k={k} beta={beta}"] = [
                    {**c, "dense": dense_feedback(rag, c, vectors[id(c)], tops[id(c)][:k], beta)} for c in cands]
            for k, m, lam in ((5, 10, 0.3), (5, 10, 0.5), (10, 20, 0.3), (3, 10, 0.3)):
                variants[f"RM3 {first} k={k} m={m} lam={lam}"] = [
                    {**c, "keyword": keyword_feedback(rag, index, c, tops[id(c)][:k], m, lam)} for c in cands]
            variants[f"both {first} k=3 beta=0.5 / k=5 m=10 lam=0.3"] = [
                {**c, "dense": dense_feedback(rag, c, vectors[id(c)], tops[id(c)][:3], 0.5),
                 "keyword": keyword_feedback(rag, index, c, tops[id(c)][:5], 10, 0.3)} for c in cands]
        for vname, vc in variants.items():
            # chunk -> paper for the new lists' rows
            missing = {r for c in vc for r, _ in c["dense"] + c["keyword"] if r not in c["paper"]}
            if missing:
                papers = {r: row.paper_id for r, row in rag.store.chunks_by_rowid(sorted(missing)).items()}
                for c in vc:
                    c["paper"] = {**c["paper"], **{r: papers[r] for r, _ in c["dense"] + c["keyword"] if r in papers}}
            for fname, fuse in FUSIONS.items():
                figures = scores(vc, fuse)
                result["variants"][f"{tokenizer} / {vname} / {fname}"] = figures
                print(f"{tokenizer:8} {vname:44} {fname:11} {figures_line(figures)}", flush=True)
    print(f"{result['papers']} papers in {args.store}; {result['load']}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
