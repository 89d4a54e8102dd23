"""nomic-embed-text-v1.5 (RAG_EMBED_MODEL=nomic-embed-text-v1.5) written out on torch, in bfloat16
where the CPU has it, from the f16 GGUF that `scripts/install_nomic.sh` puts in the model cache.

nomic-bert is BERT with rotary positions, a SwiGLU feed-forward and no biases but the layer norms';
a vector is the L2-normalised mean of the last layer's tokens; texts carry the task prefixes
`search_document: ` / `search_query: `. Torch bf16, as ONNX Runtime was slower in fp32 and too far
from fp32 in int8. Weights are read from the GGUF itself; torch and gguf load only with the model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.backends.embedders.nomic_files import NOMIC_EMBED_MODEL, NOMIC_INSTALL_HINT, nomic_gguf
from rag.backends.embedders.onnx import _MiniLM
from rag.backends.embedders.torch_encoders import cpu_has_bf16
from rag.errors import StoreError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from rag.config import Settings

QUERY_PREFIX = "search_query: "
DOCUMENT_PREFIX = "search_document: "


def nomic_tokenizer(tokens: list[str]) -> Any:
    """bert-base-uncased's WordPiece tokenizer (a `tokenizers.Tokenizer`) from the GGUF's
    vocabulary.

    llama.cpp's converter stores WordPiece tokens its own way: a word-initial piece gets a leading
    "▁" and a continuation loses its "##"; [CLS]-style specials stay as they are. Undone here, the
    ids are the model's own (checked against llama.cpp's tokenizer in tests/test_nomic.py).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    def wordpiece(token: str) -> str:
        if token.startswith("\u2581"):
            return token[1:]
        if token.startswith("[") and token.endswith("]"):
            return token
        return "##" + token

    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(wordpiece(token), i)
    tokenizer = Tokenizer(
        models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100)
    )
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


class NomicEmbed(_MiniLM):
    """nomic-embed-text-v1.5 on torch, in bfloat16 where the CPU has it: ingest and questions alike.

    Tokenising, length-sorted batching and pooling come from `_MiniLM`; this class adds the task
    prefixes and the nomic-bert encoder. Loading (~1-2 s plus importing torch) reads the GGUF once.
    """

    model_id = NOMIC_EMBED_MODEL
    dimension = 768
    # The model reads 2,048 tokens; chunks are ~250 (RAG_CHUNK_SIZE <= 250 tiktoken tokens) and a
    # longer question is cut here, where attention's cost is still small.
    max_tokens = 512
    batch_size = 8  # as TorchMiniLM: 4 and 8 measured alike in bf16, 16 slower
    pad_to = 16  # fewer distinct widths: oneDNN keeps kernels and buffers per shape

    def __init__(
        self, settings: Settings, bf16: bool | None = None, streams: int | None = None
    ) -> None:
        super().__init__()
        self.cache_dir = settings.model_cache_dir
        self.bf16 = cpu_has_bf16() if bf16 is None else bf16
        # One single-threaded batch per core, as TorchMiniLM (its small matrices leave threads
        # waiting).
        self.streams = streams or min(os.cpu_count() or 1, 8)
        self._weights: Any = None  # {tensor name: torch.Tensor} once loaded
        self._torch: Any = None

    # ---- the task prefixes ----------------------------------------------------------------------

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Word pieces per text as embedded for the index: document prefix, [CLS] and [SEP]
        included."""
        return super().count_tokens([DOCUMENT_PREFIX + t for t in texts])

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        """Unit vectors of texts as documents (the index, the answer's candidate sentences)."""
        return super().embed([DOCUMENT_PREFIX + t for t in texts], truncate)

    def embed_query(self, text: str) -> list[float]:
        """The unit vector of a question, cut to the window if longer."""
        return super().embed([QUERY_PREFIX + text], truncate=True)[0]

    # ---- the model ------------------------------------------------------------------------------

    def _load(self) -> None:
        with self._lock:
            if self._weights is None:
                self._load_file(nomic_gguf(self.cache_dir))

    def _load_file(self, path: Path) -> None:
        """Tokenizer, hyper-parameters and weights (bf16 where the CPU has it) from the GGUF."""
        import numpy as np

        try:
            import torch
            from gguf import GGUFReader
        except ImportError as exc:
            raise StoreError(
                f"{NOMIC_EMBED_MODEL} needs torch and gguf ({exc.name} is missing): "
                f"pip install -e '.[fast]' && {NOMIC_INSTALL_HINT}"
            ) from None
        reader = GGUFReader(path)

        def field(name: str) -> Any:
            if name not in reader.fields:
                raise StoreError(
                    f"{path} is not nomic-embed-text-v1.5 (no {name}); run {NOMIC_INSTALL_HINT}"
                )
            return reader.fields[name].contents()

        if field("general.architecture") != "nomic-bert":
            raise StoreError(f"{path} is not a nomic-bert model; run {NOMIC_INSTALL_HINT}")
        self.heads = int(field("nomic-bert.attention.head_count"))
        self.layers = int(field("nomic-bert.block_count"))
        self.eps = float(field("nomic-bert.attention.layer_norm_epsilon"))
        rope_base = float(field("nomic-bert.rope.freq_base"))
        tokenizer = nomic_tokenizer(field("tokenizer.ggml.tokens"))
        tokenizer.no_truncation()
        tokenizer.no_padding()

        if self.streams > 1:
            torch.set_num_threads(1)  # per batch; the batches themselves run in parallel
        dtype = torch.bfloat16 if self.bf16 else torch.float32
        # GGUF lists dimensions innermost first; the reader's arrays are already (out, in) as
        # torch's.
        weights = {t.name: torch.from_numpy(np.array(t.data)).to(dtype) for t in reader.tensors}
        for i in range(self.layers):  # gate and up as one matmul
            p = f"blk.{i}."
            weights[p + "ffn_gate_up.weight"] = torch.cat(
                [weights.pop(p + "ffn_gate.weight"), weights.pop(p + "ffn_up.weight")]
            )
        # Rotary embeddings, NeoX layout (the two halves of each head rotate together), per
        # position.
        head_dim = weights["token_embd.weight"].shape[1] // self.heads
        inverse = rope_base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(self.max_tokens, dtype=torch.float64)[:, None] * inverse[None]
        self._cos, self._sin = (a.to(dtype)[:, None, :] for a in (angles.cos(), angles.sin()))
        self._torch = torch
        self._tokenizer = tokenizer
        self._weights = weights

    def _forward(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> NDArray[np.float32]:
        import numpy as np

        if len(ids) == 1 and not mask[0, -1]:
            # A lone text (a question) needs no padding: rounding its width up to `pad_to` would
            # cost up to 15 tokens' compute on ~20. Its pooled vector ignores the padded rows.
            n = int(mask[0].sum())
            out = np.zeros((1, ids.shape[1], self.dimension), dtype=np.float32)
            out[:, :n] = self._forward(ids[:, :n], mask[:, :n])
            return out
        if self._weights is None:
            self._load()
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        with torch.inference_mode():
            ids_t = torch.from_numpy(ids)
            batch, length = ids_t.shape
            hidden = w["token_embd.weight"].shape[1]
            heads = self.heads
            head_dim, half = hidden // heads, hidden // heads // 2
            x = (w["token_embd.weight"][ids_t] + w["token_types.weight"][0]).view(
                batch * length, hidden
            )
            x = F.layer_norm(
                x, (hidden,), w["token_embd_norm.weight"], w["token_embd_norm.bias"], self.eps
            )
            keep = torch.from_numpy(mask).bool()[:, None, None, :]
            bias = (
                torch.zeros(keep.shape, dtype=x.dtype)
                .masked_fill(~keep, float("-inf"))
                .expand(batch, heads, 1, length)
                .reshape(batch * heads, 1, length)
            )
            cos, sin = self._cos[:length], self._sin[:length]

            def split_heads(t: Any) -> Any:
                return t.transpose(1, 2).reshape(batch * heads, length, head_dim)

            for i in range(self.layers):
                p = f"blk.{i}."
                qkv = F.linear(x, w[p + "attn_qkv.weight"]).view(batch, length, 3 * heads, head_dim)
                qk, v = qkv[:, :, : 2 * heads], qkv[:, :, 2 * heads :]
                first, second = qk[..., :half], qk[..., half:]
                qk = torch.cat([first * cos - second * sin, second * cos + first * sin], -1)
                q, k, v = (
                    split_heads(qk[:, :, :heads]),
                    split_heads(qk[:, :, heads:]),
                    split_heads(v),
                )
                scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=head_dim**-0.5).softmax(-1)
                a = torch.bmm(scores, v).view(batch, heads, length, head_dim).transpose(1, 2)
                a = F.linear(a.reshape(batch * length, hidden), w[p + "attn_output.weight"])
                x = F.layer_norm(
                    a.add_(x),
                    (hidden,),
                    w[p + "attn_output_norm.weight"],
                    w[p + "attn_output_norm.bias"],
                    self.eps,
                )
                gate, up = F.linear(x, w[p + "ffn_gate_up.weight"]).chunk(2, -1)
                h = F.linear(F.silu(gate).mul_(up), w[p + "ffn_down.weight"])
                x = F.layer_norm(
                    h.add_(x),
                    (hidden,),
                    w[p + "layer_output_norm.weight"],
                    w[p + "layer_output_norm.bias"],
                    self.eps,
                )
            return x.view(batch, length, hidden).float().numpy()
