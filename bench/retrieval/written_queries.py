"""Questions written from training abstracts, with hard negatives mined by all-MiniLM-L6-v2.

`bench/retrieval/data/written_queries.jsonl` holds one question per paper of ../shared/data (NeurIPS
2023-2025 and ICML 2026 workshops, never an evaluation paper), written the way a researcher asks for
a paper from memory: no method names, acronyms or runs of the abstract's words. Each line names its
paper by title (the abstract is read from ../shared/data); `heldout` lines are for the curve only.

A hard negative is a paper all-MiniLM-L6-v2 (then the default embedder) ranks in the top ten for the
question among the 16k abstracts of those two files, not the question's own: the mistakes the
product made then.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.retrieval.adapt_embedder import normal_title, training_rows

QUERIES = Path(__file__).parent / "data" / "written_queries.jsonl"
POOL_FILES = ("neurips_2023_2025.jsonl.gz", "icml2026_workshops.jsonl.gz")


def load(data: Path, path: Path = QUERIES) -> tuple[list[dict], list[str]]:
    """The questions, each with `abstract` (its paper's), and the pool's abstracts."""
    rows = training_rows(data, POOL_FILES)
    pool = [" ".join(r["abstract"].split()) for r in rows]
    by_title = {normal_title(r["title"]): i for i, r in enumerate(rows)}
    questions = []
    for line in path.read_text().splitlines():
        q = json.loads(line)
        q["paper"] = by_title[normal_title(q["title"])]
        q["abstract"] = pool[q["paper"]]
        questions.append(q)
    return questions, pool


def pool_vectors(pool: list[str], cache: Path):
    """all-MiniLM-L6-v2's vectors of the pool's abstracts (cut to its window), cached."""
    import numpy as np

    if cache.exists():
        return np.load(cache)
    from rag.backends.embedders.onnx import OnnxMiniLMBulk

    embedder = OnnxMiniLMBulk()
    vectors = np.asarray(embedder.embed(pool, truncate=True), dtype=np.float32)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, vectors)
    return vectors


def triplets(data: Path, cache: Path, top: int = 10, seed: int = 52) -> list[tuple[str, str, str]]:
    """(question, its abstract, a hard negative) for the training questions."""
    import numpy as np

    from rag.backends.embedders.onnx import OnnxMiniLM

    questions, pool = load(data)
    vectors = pool_vectors(pool, cache)
    embedder = OnnxMiniLM()
    rng = random.Random(seed)
    out, found = [], 0
    train = [q for q in questions if not q.get("heldout")]
    queries = np.asarray(embedder.embed([q["query"] for q in train], truncate=True))
    for q, scores in zip(train, queries @ vectors.T, strict=True):
        ranked = [int(i) for i in np.argsort(-scores)[: top + 1] if i != q["paper"]][:top]
        found += int(np.argmax(scores)) == q["paper"]
        out.append((q["query"], q["abstract"], pool[rng.choice(ranked)]))
    print(f"{len(out)} training questions, all-MiniLM-L6-v2 ranks {found} first among {len(pool)}")
    return out


def curve_hits(model, heldout: list[dict], pool: list[str], n: int = 2000, seed: int = 52):
    """hit@1, hit@5 of a sentence-transformers model for the held-out questions among their
    papers and `n` other pool abstracts (a fixed sample)."""
    import numpy as np

    rng = random.Random(seed)
    gold = sorted({q["paper"] for q in heldout})
    others = [i for i in rng.sample(range(len(pool)), n + len(gold)) if i not in set(gold)][:n]
    ids = gold + others
    docs = model.encode([pool[i] for i in ids], batch_size=32, normalize_embeddings=True)
    queries = model.encode([q["query"] for q in heldout], normalize_embeddings=True)
    at1 = at5 = 0
    for q, scores in zip(heldout, queries @ docs.T, strict=True):
        top = [ids[i] for i in np.argsort(-scores)[:5]]
        at1 += top[0] == q["paper"]
        at5 += q["paper"] in top
    return at1 / len(heldout), at5 / len(heldout)
