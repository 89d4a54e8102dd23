"""Cheap retrieval variants side by side, on one store: the keyword side's stemming and the fusion.

    python -m bench.retrieval.variants --store DIR [--questions FILE ...] [--json OUT]

For every question with a gold paper, the dense top 100 chunks (the store's vectors) and the BM25
top 100 are fetched once per keyword tokenizer; the fusions are then applied to those lists, so
every variant sees the same candidates. Tokenizers (rag.text.KEYWORD_STEMMERS): `light` (a plural
fold) and `snowball` (Snowball English stems; the server's BM25 function stems this way): the
store's own index when it folds words that way, else one built in memory from the store's chunks.
Fusions: dense or BM25 alone, the shipped reciprocal rank fusion (k=60, chunk ranks, the rare-name
list at weight name_boost - 1), the same over paper ranks, keyword weights 0.7 and 1.3, and convex
blends at dense weights 0.3 / 0.5 / 0.7.

Per question file and kind: hit@1 / hit@5 (paraphrase split into the part used for tuning and the
held-out part, `heldout: true`), with a 95% Wilson interval on the pooled paraphrase hit@1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from bench.retrieval.common import (
    arguments,
    candidates,
    convex,
    finish,
    gold_questions,
    keyword_index,
    new_result,
    papers,
    record,
    rrf,
)

FUSIONS: dict[str, Callable[[dict], list[str]]] = {
    "dense": lambda c: papers(c, [r for r, _ in c["dense"]]),
    "bm25": lambda c: papers(c, [r for r, _ in c["keyword"]]),
    "rrf (shipped)": rrf,
    "rrf over papers": functools.partial(rrf, by_paper=True),
    "rrf keyword x0.7": functools.partial(rrf, keyword_weight=0.7),
    "rrf keyword x1.3": functools.partial(rrf, keyword_weight=1.3),
    "convex 0.3": functools.partial(convex, dense_weight=0.3),
    "convex 0.5": functools.partial(convex, dense_weight=0.5),
    "convex 0.7": functools.partial(convex, dense_weight=0.7),
}


def main() -> int:
    args = arguments(__doc__).parse_args()

    from rag import RAG

    questions = gold_questions(args.questions)
    rag = RAG(store_dir=args.store, llm="none")
    result = new_result(rag, args.store)
    for tokenizer in ("light", "snowball"):
        cands = candidates(rag, questions, keyword_index(rag.store, tokenizer))
        for name, fuse in FUSIONS.items():
            if tokenizer == "snowball" and name == "dense":
                continue  # the same as light's
            record(result, f"{tokenizer} / {name}", cands, fuse, f"{tokenizer:8} {name:18}")
    return finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
