"""Writes nomic_reference.json: nomic-embed-text-v1.5 as llama.cpp embeds it (the reference
implementation of the GGUF rag reads), for tests/test_nomic.py to check rag's own nomic-bert against
without running llama.cpp (~2 minutes on 2 cores) in every test session.

For 20 seed abstracts whole, as ingest embeds a chunk (title, newline, abstract: 142-391 word
pieces), with the document prefix, and two questions with the query prefix: llama.cpp's mean-pooled
embedding (as the GGUF says), scaled to unit length, as float32 (base64, little-endian), and its
word pieces (with BOS).

Run by hand with llama-cpp-python (bash scripts/install_local_llm.sh) and the GGUF installed
(bash scripts/install_nomic.sh):
    python tests/data/make_nomic_reference.py
"""

import base64
import json
import sys
from pathlib import Path

import llama_cpp
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rag.backends.embedders.nomic import DOCUMENT_PREFIX, QUERY_PREFIX  # noqa: E402
from rag.backends.embedders.nomic_files import NOMIC_SHA256, nomic_gguf  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.index.chunking import chunk_text  # noqa: E402
from rag.index.corpus import parse_file  # noqa: E402

QUESTIONS = [
    "Which paper treats layer-wise learning rates as a leader-follower game?",
    "naïve Bayes vs. résumé ranking — 中文 tokens, $\\mathcal{O}(n^2)$ attention?",
]


def main() -> None:
    gguf = nomic_gguf(Settings().model_cache_dir)
    records = [r for f in sorted((REPO / "corpus").glob("*.txt")) for r in parse_file(f).records]
    texts = [chunk_text(r.title, r.abstract) for r in records[:20]]
    llm = llama_cpp.Llama(
        model_path=str(gguf),
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        verbose=False,
    )
    items = []
    for kind, prefix, text in [("document", DOCUMENT_PREFIX, t) for t in texts] + [
        ("query", QUERY_PREFIX, q) for q in QUESTIONS
    ]:
        v = np.array(llm.embed(prefix + text), dtype=np.float64)
        unit = (v / np.linalg.norm(v)).astype("<f4")
        items.append(
            {
                "kind": kind,
                "text": text,
                "word_pieces": llm.tokenize((prefix + text).encode(), add_bos=True, special=False),
                "vector": base64.b64encode(unit.tobytes()).decode(),
            }
        )
    out = Path(__file__).with_name("nomic_reference.json")
    out.write_text(
        json.dumps(
            {
                "gguf_sha256": NOMIC_SHA256,
                "llama_cpp": llama_cpp.__version__,
                "document_prefix": DOCUMENT_PREFIX,
                "query_prefix": QUERY_PREFIX,
                "items": items,
            },
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {out}: {len(items)} embeddings")


if __name__ == "__main__":
    main()
