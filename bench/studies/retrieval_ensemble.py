"""Finished study: a second embedder beside mpnet + BM25 gained one held-out question; not kept
(docs/retrieval.md).

Two embedders at once: the dense lists of two stores of the same papers fused with one BM25 list.

    python -m bench.studies.retrieval_ensemble --store MPNET-DIR --also-store MINILM-DIR [--json
OUT]

The stores hold the same papers, embedded by different models (e.g. all-mpnet-base-v2 and
all-MiniLM-L6-v2); their chunk ids differ, so everything is fused per paper: each list's paper score
is its best chunk's, scaled to 0..1 over the list's top DEPTH chunks (as the shipped convex blend
scales chunks), then weighted and summed. The BM25 list is the first store's keyword index (its own
stemmer); the rare-name boost is the shipped one. Baselines in the same run: each store alone
through the same paper-level blend, and the first store through the shipped chunk-level convex blend
(`bench.retrieval.variants.convex`). Paraphrase questions are split into the tuning part and the
held-out part (`heldout: true`); weights are read off the tuning part only.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from bench.retrieval.common import (
    arguments,
    candidates,
    convex,
    finish,
    gold_questions,
    minmax,
    new_result,
    record,
)


def paper_scores(c: dict, hits: list[tuple[int, float]]) -> dict[str, float]:
    """Each paper's best chunk score in one list, scaled to 0..1 over the list."""
    out: dict[str, float] = {}
    for rowid, s in minmax(hits).items():
        paper = c["paper"].get(rowid)
        if paper is not None:
            out[paper] = max(out.get(paper, 0.0), s)
    return out


def blend(
    first: dict, second: dict | None, w_first: float, w_second: float, boost: float = 2.0
) -> list[str]:
    """Papers by w_first * first store's dense + w_second * second's dense + the rest * BM25 (+ rare
    names)."""
    keyword = paper_scores(first, first["keyword"])
    lists = [(w_first, paper_scores(first, first["dense"])), (1.0 - w_first - w_second, keyword)]
    if second is not None and w_second:
        lists.append((w_second, paper_scores(second, second["dense"])))
    rare = {first["paper"][r] for r in first["rare"] if r in first["paper"]}
    fused: dict[str, float] = {}
    for weight, scored in lists:
        for paper, s in scored.items():
            fused[paper] = fused.get(paper, 0.0) + weight * s
    for paper in rare & keyword.keys():
        fused[paper] += boost - 1.0
    return sorted(fused, key=lambda p: -fused[p])


def main() -> int:
    ap = arguments(__doc__)
    ap.add_argument(
        "--also-store", type=Path, required=True, help="the same papers, another embedding model"
    )
    args = ap.parse_args()

    from rag import RAG

    questions = gold_questions(args.questions)
    first, second = (
        RAG(store_dir=args.store, llm="none"),
        RAG(store_dir=args.also_store, llm="none"),
    )
    a = candidates(first, questions, first.store.keyword_index())
    b = candidates(second, questions, second.store.keyword_index())
    result = new_result(first, args.store, also_store=str(args.also_store))
    record(
        result,
        "first, shipped convex 0.5",
        a,
        lambda c: convex(c, 0.5),
        f"{'first, shipped convex 0.5':34}",
    )
    index = {id(c): i for i, c in enumerate(a)}
    for w1, w2 in itertools.product((0.0, 0.2, 0.3, 0.4, 0.5, 0.6), (0.0, 0.1, 0.2, 0.3, 0.4)):
        if w1 + w2 > 0.9:
            continue
        name = f"papers: first {w1:.1f} second {w2:.1f} bm25 {1 - w1 - w2:.1f}"
        record(
            result, name, a, lambda c, w1=w1, w2=w2: blend(c, b[index[id(c)]], w1, w2), f"{name:34}"
        )
    return finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
