"""Writes mpnet_reference.json: all-mpnet-base-v2 vectors from sentence-transformers (fp32), the
reference implementation, for tests/test_embedders.py to check rag's own encoder against.

Run by hand with sentence-transformers installed and the model unpacked:
    python tests/data/make_mpnet_reference.py ~/.cache/rag/models/all-mpnet-base-v2
"""

import json
import sys
from pathlib import Path

from sentence_transformers import SentenceTransformer

TEXTS = [
    "A cat sits on the mat.",
    "Stock markets fell sharply today.",
    (
        "Why might a smaller step size for the body of a network and a larger one for its last"
        " layer train faster?"
    ),
    # Long enough for relative positions past the exact buckets (>= 8) and the log-spaced ones up to
    # 128.
    "Rethinking Neural Network Learning Rates: A Stackelberg Perspective\n"
    + "We study the training of deep networks as a leader-follower game between layers. " * 14,
]

model = SentenceTransformer(sys.argv[1], device="cpu")
vectors = model.encode(TEXTS, normalize_embeddings=True)
out = Path(__file__).with_name("mpnet_reference.json")
out.write_text(
    json.dumps({"texts": TEXTS, "vectors": [[round(float(x), 6) for x in v] for v in vectors]})
    + "\n"
)
print(f"wrote {out}")
