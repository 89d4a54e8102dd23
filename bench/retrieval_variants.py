"""Cheap retrieval variants side by side, on one store: the keyword side's stemming and the fusion.

    python -m bench.retrieval_variants --store DIR [--questions FILE ...] [--json OUT]

For every question with a gold paper, the dense top 100 chunks (the store's vectors) and the BM25 top 100
are fetched once per keyword tokenizer; the fusions are then applied to those lists, so every variant
sees the same candidates. Tokenizers (rag.text.KEYWORD_STEMMERS): `light` (a plural fold) and `snowball`
(Snowball English stems; the server's BM25 function stems this way): the store's own index when it folds
words that way, else one built in memory from the store's chunks. Fusions: dense or BM25 alone, the
shipped reciprocal rank fusion (k=60, chunk ranks, the rare-name list at weight name_boost - 1), the same
over paper ranks, keyword weights 0.7 and 1.3, and convex blends at dense weights 0.3 / 0.5 / 0.7.

Per question file and kind: hit@1 / hit@5 (paraphrase split into the part used for tuning and the
held-out part, `heldout: true`), with a 95% Wilson interval on the pooled paraphrase hit@1.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path

from bench.helpers import REPO, machine_load, wilson, write_json

QUESTIONS = [REPO / "eval/seed_questions.jsonl", REPO / "eval/user_questions.jsonl",
             REPO / "eval/paraphrase_icml.jsonl"]
DEPTH = 100  # candidates per list, as deep as any fusion below looks


def gold_questions(paths: list[Path]) -> list[dict]:
    """The questions with a gold paper of these files, each marked with its file's name."""
    questions = [{**json.loads(line), "file": path.stem} for path in paths
                 for line in path.read_text().splitlines() if line.strip()]
    return [q for q in questions if q.get("gold")]


def keyword_index(store, stemmer: str):
    """The store's keyword index if it folds words this way, else one built in memory from its chunks."""
    from rag.index.keyword import KeywordIndex

    if store.keyword_stemmer() == stemmer:
        return store.keyword_index()
    rowids = [r[0] for r in store.chunk_papers_after(-1)]
    rows = ((rowid, chunk.text) for start in range(0, len(rowids), 2000)
            for rowid, chunk in sorted(store.chunks_by_rowid(rowids[start:start + 2000]).items()))
    return KeywordIndex.build(rows, stemmer=stemmer)


def candidates(rag, questions: list[dict], index) -> list[dict]:
    """Each question's dense and BM25 (this keyword index's) top DEPTH chunks, its rare-name chunks and papers."""
    from rag.retrieve.search import RARE_NAME_MAX_PAPERS

    store = rag.store
    out = []
    for q in questions:
        keyword = index.search(q["question"], DEPTH)
        rare = index.rare_term_keys(
            q["question"], lambda ids: [c.paper_id for c in store.chunks_by_rowid(ids).values()],
            RARE_NAME_MAX_PAPERS)
        dense = store.dense_search(rag.embedder.embed_query(q["question"]), DEPTH) or []
        papers = {r: c.paper_id for r, c in store.chunks_by_rowid(list({r for r, _ in dense + keyword})).items()}
        out.append({"q": q, "dense": dense, "keyword": keyword, "rare": set(rare), "paper": papers})
    return out


def _papers(c: dict, rowids) -> list[str]:
    return list(dict.fromkeys(c["paper"][r] for r in rowids if r in c["paper"]))


def rrf(c: dict, k: int = 60, dense_weight: float = 1.0, keyword_weight: float = 1.0, boost: float = 2.0,
        by_paper: bool = False) -> list[str]:
    lists = [(dense_weight, [r for r, _ in c["dense"]]), (keyword_weight, [r for r, _ in c["keyword"]]),
             (boost - 1.0, [r for r, _ in c["keyword"] if r in c["rare"]])]
    fused: dict = {}
    for weight, ranking in lists:
        for rank, item in enumerate(_papers(c, ranking) if by_paper else ranking):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank + 1)
    order = sorted(fused, key=lambda x: -fused[x])
    return order if by_paper else _papers(c, order)


def convex(c: dict, dense_weight: float, boost: float = 2.0) -> list[str]:
    def scaled(hits):
        if not hits:
            return {}
        lo, hi = min(s for _, s in hits), max(s for _, s in hits)
        return {r: (s - lo) / (hi - lo) if hi > lo else 1.0 for r, s in hits}

    d, b = scaled(c["dense"]), scaled(c["keyword"])
    fused = {r: dense_weight * d.get(r, 0.0) + (1 - dense_weight) * b.get(r, 0.0)
             + (boost - 1.0 if r in c["rare"] and r in b else 0.0) for r in d.keys() | b.keys()}
    return _papers(c, sorted(fused, key=lambda r: -fused[r]))


FUSIONS: dict[str, Callable[[dict], list[str]]] = {
    "dense": lambda c: _papers(c, [r for r, _ in c["dense"]]),
    "bm25": lambda c: _papers(c, [r for r, _ in c["keyword"]]),
    "rrf (shipped)": rrf,
    "rrf over papers": functools.partial(rrf, by_paper=True),
    "rrf keyword x0.7": functools.partial(rrf, keyword_weight=0.7),
    "rrf keyword x1.3": functools.partial(rrf, keyword_weight=1.3),
    "convex 0.3": functools.partial(convex, dense_weight=0.3),
    "convex 0.5": functools.partial(convex, dense_weight=0.5),
    "convex 0.7": functools.partial(convex, dense_weight=0.7),
}


def scores(cands: list[dict], fuse: Callable[[dict], list[str]]) -> dict[str, dict]:
    groups: dict[str, list[tuple[bool, bool]]] = {}
    for c in cands:
        q = c["q"]
        if q["kind"] not in ("paraphrase", "keyword", "numeric"):
            continue
        order = fuse(c)
        hit = (bool(order) and order[0] in q["gold"], any(p in q["gold"] for p in order[:5]))
        split = ("-held-out" if q.get("heldout") else "-tuning") if q["kind"] == "paraphrase" else ""
        groups.setdefault(f"{q['file']}:{q['kind']}{split}", []).append(hit)
        if q["kind"] == "paraphrase":
            groups.setdefault(f"all:paraphrase{split}", []).append(hit)
    out = {}
    for name, hits in sorted(groups.items()):
        h1 = sum(a for a, _ in hits)
        out[name] = {"n": len(hits), "hit@1": round(h1 / len(hits), 3),
                     "hit@5": round(sum(b for _, b in hits) / len(hits), 3),
                     "hit@1 95%": [round(x, 2) for x in wilson(h1, len(hits))]}
    return out


def figures_line(figures: dict[str, dict]) -> str:
    """Paraphrase hit@1/hit@5 (tuning, held-out), then keyword and numeric hit@1 per file, on one line."""
    para = {k.split(":")[1]: v for k, v in figures.items() if k.startswith("all:")}
    others = {k: v for k, v in figures.items() if k.endswith((":keyword", ":numeric"))}
    return ("  ".join(f"{k.removeprefix('paraphrase-')} {v['hit@1']:.2f}/{v['hit@5']:.2f} (n={v['n']})"
                      for k, v in para.items())
            + "  | " + "  ".join(f"{k} {v['hit@1']:.2f}" for k, v in others.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="a store holding the seeds and the ICML 2026 main track")
    ap.add_argument("--questions", type=Path, nargs="+", default=[p for p in QUESTIONS if p.exists()])
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from rag import RAG

    questions = gold_questions(args.questions)
    rag = RAG(store_dir=args.store, llm="none")
    result: dict = {"store": str(args.store), "papers": rag.store.paper_count(), "load": machine_load(), "variants": {}}
    for tokenizer in ("light", "snowball"):
        cands = candidates(rag, questions, keyword_index(rag.store, tokenizer))
        for name, fuse in FUSIONS.items():
            if tokenizer == "snowball" and name == "dense":
                continue  # the same as light's
            figures = scores(cands, fuse)
            result["variants"][f"{tokenizer} / {name}"] = figures
            print(f"{tokenizer:8} {name:18} {figures_line(figures)}", flush=True)
    print(f"{result['papers']} papers in {args.store}; {result['load']}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
