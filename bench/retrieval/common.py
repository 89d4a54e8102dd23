"""What the retrieval comparisons share (`bench.retrieval.variants` and the studies that fuse other
lists): the question files and their gold papers, each question's dense and BM25 candidates fetched
once, the shipped fusions over them, hit@1 / hit@5 per question file and kind, and the options,
result and report of a run.

Not a script: `python -m bench.retrieval.variants` is the comparison itself.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path

from bench.helpers import REPO, machine_load, wilson, write_json

QUESTIONS = [
    REPO / "eval/seed_questions.jsonl",
    REPO / "eval/user_questions.jsonl",
    REPO / "eval/paraphrase_icml.jsonl",
]
DEPTH = 100  # candidates per list, as deep as any fusion looks


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options every comparison takes: --store, --questions, --json (a script adds its own)."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--store",
        type=Path,
        required=True,
        help="a store holding the seeds and the ICML 2026 main track",
    )
    ap.add_argument(
        "--questions", type=Path, nargs="+", default=[p for p in QUESTIONS if p.exists()]
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    return ap


def gold_questions(paths: list[Path]) -> list[dict]:
    """The questions with a gold paper of these files, each marked with its file's name."""
    questions = [
        {**json.loads(line), "file": path.stem}
        for path in paths
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return [q for q in questions if q.get("gold")]


def keyword_index(store, stemmer: str):
    """The store's keyword index if it folds words this way, else one built in memory from its
    chunks."""
    from rag.index.keyword import KeywordIndex

    if store.keyword_stemmer() == stemmer:
        return store.keyword_index()
    rowids = [r[0] for r in store.chunk_papers_after(-1)]
    rows = (
        (rowid, chunk.text)
        for start in range(0, len(rowids), 2000)
        for rowid, chunk in sorted(store.chunks_by_rowid(rowids[start : start + 2000]).items())
    )
    return KeywordIndex.build(rows, stemmer=stemmer)


def candidates(rag, questions: list[dict], index) -> list[dict]:
    """Each question's dense and BM25 (this keyword index's) top DEPTH chunks, its rare-name chunks
    and papers."""
    from rag.retrieve.search import RARE_NAME_MAX_PAPERS

    store = rag.store
    out = []
    for q in questions:
        keyword = index.search(q["question"], DEPTH)
        rare = index.rare_term_keys(
            q["question"],
            lambda ids: [c.paper_id for c in store.chunks_by_rowid(ids).values()],
            RARE_NAME_MAX_PAPERS,
        )
        dense = store.dense_search(rag.embedder.embed_query(q["question"]), DEPTH) or []
        papers = {
            r: c.paper_id
            for r, c in store.chunks_by_rowid(list({r for r, _ in dense + keyword})).items()
        }
        out.append({"q": q, "dense": dense, "keyword": keyword, "rare": set(rare), "paper": papers})
    return out


def papers(c: dict, rowids) -> list[str]:
    """These chunks' papers, in order, each once."""
    return list(dict.fromkeys(c["paper"][r] for r in rowids if r in c["paper"]))


def minmax(hits: Iterable[tuple[Hashable, float]]) -> dict:
    """Scores scaled to 0..1 over the list (all 1.0 when they are equal), as the shipped convex
    blend scales them."""
    hits = list(hits)
    if not hits:
        return {}
    lo, hi = min(s for _, s in hits), max(s for _, s in hits)
    return {key: (s - lo) / (hi - lo) if hi > lo else 1.0 for key, s in hits}


def rrf(
    c: dict,
    k: int = 60,
    dense_weight: float = 1.0,
    keyword_weight: float = 1.0,
    boost: float = 2.0,
    by_paper: bool = False,
) -> list[str]:
    """Reciprocal rank fusion of the dense, BM25 and rare-name lists (the shipped constants by
    default)."""
    lists = [
        (dense_weight, [r for r, _ in c["dense"]]),
        (keyword_weight, [r for r, _ in c["keyword"]]),
        (boost - 1.0, [r for r, _ in c["keyword"] if r in c["rare"]]),
    ]
    fused: dict = {}
    for weight, ranking in lists:
        for rank, item in enumerate(papers(c, ranking) if by_paper else ranking):
            fused[item] = fused.get(item, 0.0) + weight / (k + rank + 1)
    order = sorted(fused, key=lambda x: -fused[x])
    return order if by_paper else papers(c, order)


def convex(c: dict, dense_weight: float, boost: float = 2.0) -> list[str]:
    """A convex blend of the min-max scaled dense and BM25 scores, plus the rare-name boost."""
    d, b = minmax(c["dense"]), minmax(c["keyword"])
    fused = {
        r: dense_weight * d.get(r, 0.0)
        + (1 - dense_weight) * b.get(r, 0.0)
        + (boost - 1.0 if r in c["rare"] and r in b else 0.0)
        for r in d.keys() | b.keys()
    }
    return papers(c, sorted(fused, key=lambda r: -fused[r]))


def scores(cands: list[dict], fuse: Callable[[dict], list[str]]) -> dict[str, dict]:
    """hit@1 / hit@5 (and hit@1's 95% interval) per question file and kind, paraphrases split tuning
    / held out."""
    groups: dict[str, list[tuple[bool, bool]]] = {}
    for c in cands:
        q = c["q"]
        if q["kind"] not in ("paraphrase", "keyword", "numeric"):
            continue
        order = fuse(c)
        hit = (bool(order) and order[0] in q["gold"], any(p in q["gold"] for p in order[:5]))
        split = (
            ("-held-out" if q.get("heldout") else "-tuning") if q["kind"] == "paraphrase" else ""
        )
        groups.setdefault(f"{q['file']}:{q['kind']}{split}", []).append(hit)
        if q["kind"] == "paraphrase":
            groups.setdefault(f"all:paraphrase{split}", []).append(hit)
    out = {}
    for name, hits in sorted(groups.items()):
        h1 = sum(a for a, _ in hits)
        out[name] = {
            "n": len(hits),
            "hit@1": round(h1 / len(hits), 3),
            "hit@5": round(sum(b for _, b in hits) / len(hits), 3),
            "hit@1 95%": [round(x, 2) for x in wilson(h1, len(hits))],
        }
    return out


def figures_line(figures: dict[str, dict]) -> str:
    """Paraphrase hit@1/hit@5 (tuning, held-out), then keyword and numeric hit@1 per file, on one
    line."""
    para = {k.split(":")[1]: v for k, v in figures.items() if k.startswith("all:")}
    others = {k: v for k, v in figures.items() if k.endswith((":keyword", ":numeric"))}
    return (
        "  ".join(
            f"{k.removeprefix('paraphrase-')} {v['hit@1']:.2f}/{v['hit@5']:.2f} (n={v['n']})"
            for k, v in para.items()
        )
        + "  | "
        + "  ".join(f"{k} {v['hit@1']:.2f}" for k, v in others.items())
    )


def new_result(rag, store: Path, **more) -> dict:
    """A run's result: the store, its papers, the machine's load, and the variants' figures to
    come."""
    return {
        "store": str(store),
        "papers": rag.store.paper_count(),
        "load": machine_load(),
        **more,
        "variants": {},
    }


def record(
    result: dict, name: str, cands: list[dict], fuse: Callable[[dict], list[str]], label: str
) -> None:
    """Score one variant, keep its figures under `name` and print them after `label`."""
    figures = result["variants"][name] = scores(cands, fuse)
    print(f"{label} {figures_line(figures)}", flush=True)


def finish(result: dict, json_path: Path | None) -> int:
    """The run's last line (papers, store, load) and its JSON; the exit status."""
    print(f"{result['papers']} papers in {result['store']}; {result['load']}")
    if json_path:
        write_json(json_path, result)
    return 0
