"""More dense lists beside the shipped chunk vectors, fused by rank, on one store: every sentence and every
title embedded (a paper scored by its best sentence or its title), and a hypothetical abstract written by
the local model for each question (HyDE / query2doc) embedded and searched by keywords.

    python -m bench.retrieval_lists --store DIR [--questions FILE ...] [--hyde FILE] [--json OUT]

The sentences and titles are embedded once with the store's embedder (kept in DIR-independent
`--vectors FILE.npz`, made when missing: ~8 min for 47,728 texts of 5,871 papers on 2 cores). The
hypothetical abstracts come from the local Qwen (RAG_LLM=local's model: "write two sentences as they would
appear in the abstract of the paper that answers this question"), made once into `--hyde FILE.jsonl`, one
line per question with the seconds it took. Every variant is scored on the same questions (the paraphrase,
keyword and numeric questions with gold of bench.retrieval_variants' files), paraphrases split into the
part used for tuning and the held-out part (`heldout: true`).

Lists: `dq` the store's dense chunk search, `kq` its BM25, `ds` best sentence, `dt` title, `dh` the
hypothetical abstract, `dqh` the question and hypothetical abstract embedded together, `kqh` BM25 on both;
the shipped rare-name list (weight 1) is added to every fusion. Lists are fused by paper rank (the product
fuses chunk ranks; bench.retrieval_variants measures both: within 0.02 of each other), so the first
variant, the shipped lists alone, is the baseline of this table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.helpers import machine_load, percentile, write_json
from bench.retrieval_variants import DEPTH, QUESTIONS, wilson

HYDE_SYSTEM = "You are an expert in machine learning research."
HYDE_PROMPT = ("Question: {question}\n\nWrite two sentences as they would appear in the abstract of the research "
               "paper that answers this question. Use the technical terms and method names such a paper would "
               "use. Write only the two sentences.")


def embed_texts(rag, path: Path):
    """Every title (kind 0) and sentence (kind 1) of the store's papers, embedded; cached in `path`."""
    import numpy as np

    from rag.answer.evidence import source_sentences

    if path.exists():
        z = np.load(path)
        return z["vecs"], z["kinds"], z["ids"]
    rows = [(paper.paper_id, text, kind) for paper, abstract in rag.store.all_papers()
            for kind, text in [(0, paper.title), *((1, s) for s in source_sentences(abstract or ""))]]
    ids, texts, kinds = (list(column) for column in zip(*rows))
    started = time.perf_counter()
    vecs = [v for i in range(0, len(texts), 256) for v in rag.embedder.embed(texts[i:i + 256], truncate=True)]
    print(f"embedded {len(texts)} titles and sentences in {time.perf_counter() - started:.0f} s ({machine_load()})")
    arrays = (np.asarray(vecs, dtype=np.float32), np.asarray(kinds), np.asarray(ids))
    np.savez(path, vecs=arrays[0], kinds=arrays[1], ids=arrays[2])
    return arrays


def hypothetical_abstracts(questions: list[dict], path: Path) -> dict[str, dict]:
    """The local model's hypothetical abstract per question, cached in `path` (one JSON line each)."""
    done = {}
    if path.exists():
        done = {row["key"]: row for row in map(json.loads, path.read_text().splitlines())}
    missing = [q for q in questions if q["key"] not in done]
    if missing:
        from rag.backends.chat import LocalChat
        from rag.config import Settings

        model = LocalChat(Settings())._llm
        with path.open("a") as out:
            for q in missing:
                started = time.perf_counter()
                reply = model.create_chat_completion(
                    messages=[{"role": "system", "content": HYDE_SYSTEM},
                              {"role": "user", "content": HYDE_PROMPT.format(question=q["question"])}],
                    temperature=0.0, max_tokens=90)
                row = {"key": q["key"], "text": reply["choices"][0]["message"]["content"] or "",
                       "secs": round(time.perf_counter() - started, 2)}
                out.write(json.dumps(row) + "\n")
                done[q["key"]] = row
    return done


def candidate_lists(rag, questions: list[dict], vectors, hyde: dict[str, dict]) -> list[dict]:
    import numpy as np

    from rag.retrieve.search import RARE_NAME_MAX_PAPERS

    matrix, kinds, ids = vectors
    papers, owner = np.unique(ids, return_inverse=True)
    store, index = rag.store, rag.store.keyword_index()

    def best_per_paper(sims, mask) -> list[str]:
        best = np.full(len(papers), -9.0, dtype=np.float32)
        np.maximum.at(best, owner[mask], sims[mask])
        return [str(p) for p in papers[np.argsort(-best)[:DEPTH]]]

    out = []
    for q in questions:
        text = hyde[q["key"]]["text"].strip()
        vq = np.asarray(rag.embedder.embed_query(q["question"]), dtype=np.float32)
        chunk_lists = {"dq": store.dense_search(vq.tolist(), DEPTH) or [],
                       "dh": store.dense_search(rag.embedder.embed_query(text), DEPTH) or [],
                       "dqh": store.dense_search(rag.embedder.embed_query(f"{q['question']} {text}"), DEPTH) or [],
                       "kq": index.search(q["question"], DEPTH), "kqh": index.search(f"{q['question']} {text}", DEPTH)}
        rare = set(index.rare_term_keys(q["question"], lambda i: [c.paper_id for c in store.chunks_by_rowid(i).values()],
                                        RARE_NAME_MAX_PAPERS))
        rowids = list({r for hits in chunk_lists.values() for r, _ in hits})
        paper_of = {r: c.paper_id for r, c in store.chunks_by_rowid(rowids).items()}
        lists = {name: list(dict.fromkeys(paper_of[r] for r, _ in hits if r in paper_of))
                 for name, hits in chunk_lists.items()}
        lists["rare"] = list(dict.fromkeys(paper_of[r] for r, _ in chunk_lists["kq"] if r in rare and r in paper_of))
        sims = matrix @ vq
        lists["ds"], lists["dt"] = best_per_paper(sims, kinds == 1), best_per_paper(sims, kinds == 0)
        out.append({"q": q, "lists": lists})
    return out


def fuse(c: dict, names: tuple[str, ...], k: int = 60) -> list[str]:
    """Reciprocal rank fusion of the named paper lists and the rare-name list (the shipped constants)."""
    scores: dict[str, float] = {}
    for name in (*names, "rare"):
        for rank, paper in enumerate(c["lists"][name]):
            scores[paper] = scores.get(paper, 0.0) + 1.0 / (k + rank + 1)
    return sorted(scores, key=lambda p: -scores[p])


VARIANTS: dict[str, tuple[str, ...]] = {
    "dq + kq (the shipped lists, by paper rank)": ("dq", "kq"),
    "ds + kq (sentences instead of chunks)": ("ds", "kq"),
    "dq + kq + ds": ("dq", "kq", "ds"),
    "dq + kq + dt": ("dq", "kq", "dt"),
    "dq + kq + ds + dt": ("dq", "kq", "ds", "dt"),
    "HyDE: dqh + kqh": ("dqh", "kqh"),
    "HyDE: dq + kq + dh + kh": ("dq", "kq", "dh", "kqh"),
    "HyDE: dq + kq + dqh + kqh": ("dq", "kq", "dqh", "kqh"),
    "HyDE: dqh + kq": ("dqh", "kq"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="a store holding the seeds and the ICML 2026 main track")
    ap.add_argument("--questions", type=Path, nargs="+", default=[p for p in QUESTIONS if p.exists()])
    ap.add_argument("--vectors", type=Path, default=Path("retrieval_lists_vectors.npz"),
                    help="the titles' and sentences' vectors (made when missing)")
    ap.add_argument("--hyde", type=Path, default=Path("retrieval_lists_hyde.jsonl"),
                    help="the hypothetical abstracts (made with the local model when missing)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    from rag import RAG

    questions = [{**q, "key": f"{path.stem}:{q['id']}"} for path in args.questions
                 for q in map(json.loads, filter(str.strip, path.read_text().splitlines()))]
    questions = [q for q in questions if q.get("gold") and q["kind"] in ("paraphrase", "keyword", "numeric")]
    rag = RAG(store_dir=args.store, llm="none")
    hyde = hypothetical_abstracts(questions, args.hyde)
    seconds = [hyde[q["key"]]["secs"] for q in questions]
    cands = candidate_lists(rag, questions, embed_texts(rag, args.vectors), hyde)
    result: dict = {"store": str(args.store), "papers": rag.store.paper_count(), "load": machine_load(),
                    "hyde_seconds": {"p50": percentile(seconds, 50), "p95": percentile(seconds, 95)}, "variants": {}}
    for name, names in VARIANTS.items():
        groups: dict[str, list[tuple[bool, bool]]] = {}
        for c in cands:
            q, order = c["q"], fuse(c, names)
            hit = (bool(order) and order[0] in q["gold"], any(p in q["gold"] for p in order[:5]))
            kind = q["kind"] + (("-held-out" if q.get("heldout") else "-tuning") if q["kind"] == "paraphrase" else "")
            groups.setdefault(kind, []).append(hit)
        figures = {kind: {"n": len(h), "hit@1": round(sum(a for a, _ in h) / len(h), 3),
                          "hit@5": round(sum(b for _, b in h) / len(h), 3),
                          "hit@1 95%": [round(x, 2) for x in wilson(sum(a for a, _ in h), len(h))]}
                   for kind, h in sorted(groups.items())}
        result["variants"][name] = figures
        print(f"{name:44} " + "  ".join(f"{k} {v['hit@1']:.2f}/{v['hit@5']:.2f}" for k, v in figures.items()))
    print(f"{result['papers']} papers; hypothetical abstract p50 {result['hyde_seconds']['p50']:.1f} s, "
          f"p95 {result['hyde_seconds']['p95']:.1f} s each; {result['load']}")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
