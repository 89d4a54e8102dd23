"""Writes minilm_ml_reference.json: minilm-l6-ml-v1's vectors with exact int8 products (its weights
rewritten as uint8, `rag/backends/embedders/int8_products.py`, which every CPU multiplies exactly),
for tests/test_embedders.py to check that any CPU gives the same vectors.

Run by hand: python tests/data/make_minilm_ml_reference.py
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from rag.backends.embedders.int8_products import unsigned_weights
from rag.backends.embedders.onnx import OnnxMiniLM, ml_minilm_files
from rag.config import ML_EMBED_MODEL

TEXTS = [
    "Which paper treats the layers of a network and their learning rates as a game?",
    "how do I debias attention heads in CLIP",
    # Long, with large activations: where saturating int8 products go wrong.
    "Rethinking Neural Network Learning Rates: A Stackelberg Perspective\n"
    + "We study the training of deep networks as a leader-follower game between layers. " * 14,
    (
        "Learning to Remember, Learn, and Forget in Attention-Based Models\nWe demonstrate that"
        " various gated linear attention models emerge as specific architecture choices and"
        " posterior approximations, and that Mamba2 is a special case of Palimpsa where forgetting"
        " dominates."
    ),
]

model_path, _ = ml_minilm_files()
data = bytearray(model_path.read_bytes())
assert unsigned_weights(data) > 0
embedder = OnnxMiniLM(ML_EMBED_MODEL)
embedder._load()
embedder._session = ort.InferenceSession(bytes(data), providers=["CPUExecutionProvider"])
vectors = np.asarray(embedder.embed(TEXTS, truncate=True))
out = Path(__file__).with_name("minilm_ml_reference.json")
out.write_text(
    json.dumps({"texts": TEXTS, "vectors": [[round(float(x), 6) for x in v] for v in vectors]})
    + "\n"
)
print(f"wrote {out}")
