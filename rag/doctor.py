"""`rag doctor`: check the configuration, the store, the embedding model and the LLM endpoint,
and say what is wrong and how to fix it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass

from rag.config import redact_url
from rag.errors import RagError
from rag.index.store import StoreDamaged
from rag.index.vectors import VectorsDamaged, VectorsUnwritable, repair_command


@dataclass
class Check:
    name: str
    status: str  # "ok" | "warn" | "fail"
    detail: str
    fix: str = ""


def run_checks(rag) -> list[Check]:
    checks = [_config(rag), _settings_sources()]
    checks += _store(rag)
    checks.append(_embedder(rag))
    checks += _llm(rag)
    return checks


def _config(rag) -> Check:
    s = rag.settings
    where = f"vectors on {redact_url(s.chroma_url)}" if s.chroma_url else "embedded Chroma"
    return Check(
        "config",
        "ok",
        f"store {s.store_dir} ({where}); embeddings {s.embed_model}; "
        f"LLM {s.llm_backend}" + (f" ({s.llm_model})" if s.llm_backend == "openai" else ""),
    )


def _settings_sources() -> Check:
    """Where the settings came from: the .env files read and the variables set (names only: values
    may be keys), so a setting that does not take effect can be traced."""
    import os

    from rag.config import env_files

    candidates = env_files()
    files = [str(p) for p in candidates if p.is_file()]
    names = sorted(n for n in os.environ if n.startswith(("RAG_", "OPENAI_")))
    looked = " or ".join(str(p) for p in candidates)
    return Check(
        "settings",
        "ok",
        f"read from {', '.join(files) if files else f'no .env file (looked for {looked})'}; "
        f"environment: {', '.join(names) if names else 'no RAG_* or OPENAI_* variable'}",
    )


def _store(rag) -> list[Check]:
    """The server (when there is one), the manifest, the vectors and the keyword index. Every fix
    offered keeps the papers the store holds: a damaged file is repaired by re-indexing what is left
    (`rag repair`), never by `--rebuild`."""
    try:
        return _store_checks(rag)
    except StoreDamaged as exc:
        return [Check("store", "fail", str(exc).split("; run")[0], _repair_fix(rag))]


def _repair_fix(rag) -> str:
    return (
        f"{repair_command(rag.store.dir)} (re-indexes every paper papers.sqlite still holds; the"
        " old files are kept)"
    )


def _server_checks(rag) -> list[Check]:
    """A Chroma server, looked at before any catch-up (which a broken server could stop): can it be
    reached in time, is the collection there, and what its metadata claims. Advice never comes from
    the server's metadata (anyone who can reach it can write there)."""
    from rag.index.replica import SERVER_COLLECTION

    store, server = rag.store, rag.store.server
    if server is None:
        return []
    name = store.collection_name
    papers = 0
    with contextlib.suppress(RagError, sqlite3.Error):
        papers = store.paper_count()
    try:
        state = server.state()
    except RagError as exc:
        cached = f": questions answer from the {papers:,} papers cached here" if papers else ""
        return [
            Check(
                "server",
                "warn" if papers else "fail",
                str(exc).split("; ")[0] + cached,
                "check RAG_CHROMA_URL and that the server is up",
            )
        ]
    if state is None:
        if not papers:
            return []  # the store check says there are no papers yet
        return [
            Check(
                "server",
                "fail",
                f"Chroma collection {name!r} is not on the server (deleted, or the server lost its"
                f" data); this store still holds its {papers:,} papers",
                f"{repair_command(store.dir)} (pushes them back to the server)",
            )
        ]
    out = [Check("server", "ok", f"Chroma collection {name!r}: {state[1]:,} chunks")]
    recorded = store.meta(SERVER_COLLECTION) if store.exists() else None
    if recorded not in (None, state[0]):
        out[0].detail += " (a collection made since this store's caches were built)"
    claim = server.corpus_model()
    built_with = store.meta("embedding_model") if store.exists() else None
    if claim and built_with and claim != built_with:
        out.append(
            Check(
                "server",
                "warn",
                f"the collection's metadata names embedding model {claim[:80]!r}; this store"
                f" uses {built_with} (what the server's metadata says is not believed)",
                "",
            )
        )
    return out


def _server_findings(rag) -> list[Check]:
    """What the last catch-up skipped or found missing on the server (kept in the manifest)."""
    from rag.index.replica import SERVER_MISSING, SERVER_SKIPPED

    store = rag.store
    if store.server is None or not store.exists():
        return []
    out = []
    try:
        skipped = json.loads(store.meta(SERVER_SKIPPED) or "[]")
        missing = int(store.meta(SERVER_MISSING) or 0)
    except (ValueError, TypeError):
        skipped, missing = [], 0
    if skipped and isinstance(skipped, list):
        out.append(
            Check(
                "server records",
                "warn",
                f"{len(skipped)} invalid record(s) in the collection were skipped: "
                + "; ".join(str(x) for x in skipped[:10]),
                "delete or rewrite them on the server (rag never writes such records: another"
                " client did)",
            )
        )
    if missing:
        out.append(
            Check(
                "server records",
                "warn",
                f"{missing:,} of this store's chunks are not on the server (kept here)",
                f"{repair_command(store.dir)} (pushes them back to the server)",
            )
        )
    return out


def _store_checks(rag) -> list[Check]:
    server = _server_checks(rag)
    try:
        rag.catch_up()  # on a Chroma server: the caches brought level with the corpus there first
    except StoreDamaged:
        raise
    except RagError as exc:
        return server + [
            Check(
                "store", "fail", str(exc).split("; ")[0], "check RAG_CHROMA_URL and RAG_COLLECTION"
            )
        ]
    return server + _server_findings(rag) + _cache_checks(rag)


def _cache_checks(rag) -> list[Check]:
    """The manifest, the vectors and the keyword index (caught up with a server, if any)."""
    store = rag.store
    if not store.exists() or store.paper_count() == 0:
        if not rag.settings.is_default_store:
            return [
                Check(
                    "store",
                    "fail",
                    f"no index at {store.dir}",
                    f"check the path, or build it: `rag ingest FILE... --store {store.dir}`",
                )
            ]
        return [
            Check(
                "store",
                "warn",
                f"no index yet at {store.dir}",
                "run `rag ingest` (or just ask: the first question builds it from corpus/)",
            )
        ]
    out = []
    try:
        store.check_compatible(rag.settings.embed_model)
    except StoreDamaged:
        raise
    except RagError as exc:
        built_with = store.meta("embedding_model")
        return [
            Check(
                "store",
                "fail",
                str(exc).split(";")[0],
                f"set RAG_EMBED_MODEL={built_with}, or re-index every paper with the new model: "
                f"{repair_command(store.dir)}"
                if built_with
                else _repair_fix(rag),
            )
        ]
    papers, chunks = store.paper_count(), store.chunk_count()
    integrity = store.quick_check()
    if integrity != "ok":
        first = " ".join(integrity.split())[:160]
        return [Check("store", "fail", f"papers.sqlite is damaged ({first})", _repair_fix(rag))]
    out.append(
        Check(
            "store",
            "ok",
            f"{papers} papers, {chunks} chunks, built with {store.meta('embedding_model')}, "
            f"schema {store.meta('schema_version')}",
        )
    )
    try:
        vectors = store.vector_count()
    except VectorsDamaged as exc:
        return out + [
            Check(
                "vectors",
                "fail",
                str(exc).split("; run")[0] + ": questions use keyword retrieval only",
                _repair_fix(rag),
            )
        ]
    except VectorsUnwritable as exc:
        # Not a damaged index (a rebuild would not help): questions use keyword retrieval meanwhile.
        reason, _, fix = str(exc).partition("; ")
        return out + [
            Check("vectors", "warn", f"{reason}: questions use keyword retrieval only", fix)
        ]
    except RagError as exc:
        return out + [Check("vectors", "fail", str(exc), "check RAG_CHROMA_URL")]
    except Exception as exc:  # Chroma's own error types: a damaged file read only now
        return out + [
            Check(
                "vectors",
                "fail",
                f"the vectors cannot be counted ({' '.join(str(exc).split())[:160]})",
                _repair_fix(rag),
            )
        ]
    where = (
        f" in collection {store.collection_name!r} on {redact_url(rag.settings.chroma_url)}"
        if rag.settings.chroma_url
        else ""
    )
    if where and store.vectors_gone():
        return out + [
            Check(
                "vectors",
                "fail",
                store.vectors_gone_message().split("; ")[0] + ": questions use keyword "
                "retrieval only",
                f"{repair_command(store.dir)} (pushes this store's papers back to it), or set "
                "RAG_COLLECTION to the collection that holds them",
            )
        ]
    if vectors < chunks:
        out.append(
            Check(
                "vectors",
                "fail",
                f"{chunks - vectors} chunks have no vector ({vectors} of {chunks}): "
                "dense retrieval misses them",
                _repair_fix(rag),
            )
        )
    elif vectors > chunks and where:
        out.append(
            Check(
                "vectors",
                "ok",
                f"{chunks} vectors of this store{where}, which holds {vectors - chunks:,} "
                "more (other stores share it, or an interrupted ingest left them)",
            )
        )
    elif vectors > chunks:
        out.append(
            Check(
                "vectors",
                "warn",
                f"{vectors - chunks} vectors without a committed chunk (left by an "
                "interrupted ingest; ignored by queries)",
                f"re-run the interrupted `rag ingest`, or `{repair_command(store.dir)}` to drop"
                " them",
            )
        )
    else:
        out.append(Check("vectors", "ok", f"{vectors} vectors, one per chunk{where}"))
    stale = store.keyword_index_stale()
    keyword = store.keyword_index()
    state = (
        "brought up to date in memory (the file is missing, unreadable, of an older format or"
        " another stemmer, or behind the chunks: an ingest running or killed)"
        if stale
        else f"loaded, {len(keyword.segments)} segment(s)"
    ) + f"; {keyword.stemmer} stems"
    # where keyword ranking runs: the server's sparse index, when it has one
    if rag.settings.chroma_url:
        state += (
            "; keywords are ranked on the server (its BM25 sparse index)"
            if store.server_keyword_search()
            else (
                "; keywords are ranked here (the server has no sparse index: only Chroma's"
                " distributed deployment has one)"
            )
        )
    out.append(
        Check(
            "keyword index",
            "warn" if stale else "ok",
            f"{len(keyword)} chunks, {state}",
            "rag ingest" if stale else "",
        )
    )
    return out


def _embedder(rag) -> Check:
    try:
        start = time.perf_counter()
        vector = rag.embedder.embed_query("a test sentence about attention")
        ms = (time.perf_counter() - start) * 1000
    except RagError as exc:
        return Check("embeddings", "fail", str(exc), "check RAG_EMBED_MODEL")
    return Check(
        "embeddings",
        "ok",
        f"{rag.embedder.model_id}: {len(vector)} dimensions, first vector in {ms:.0f} ms",
    )


def _local_model(rag) -> Check:
    """The local model's file: the bundled Qwen GGUF re-hashed against its known SHA-256."""
    from rag.backends.modelfiles import LOCAL_INSTALL_HINT, QWEN_SHA256, qwen_gguf

    s = rag.settings
    if s.local_model_path is not None:
        ok = s.local_model_path.is_file()
        return Check(
            "local model",
            "ok" if ok else "fail",
            f"{s.local_model_path}" + ("" if ok else " does not exist"),
            ""
            if ok
            else "set RAG_LOCAL_MODEL_PATH to a .gguf file, or unset it for the bundled model",
        )
    try:
        path = qwen_gguf(s.model_cache_dir, verify=True)
    except RagError as exc:
        return Check("local model", "fail", str(exc).split(";")[0], LOCAL_INSTALL_HINT)
    return Check(
        "local model",
        "ok",
        f"Qwen2.5-Coder-1.5B-Instruct at {path}, SHA-256 {QWEN_SHA256[:12]}… verified",
    )


def _llm(rag) -> list[Check]:
    if rag.settings.llm_backend == "none":
        return [_no_llm(rag)]
    if rag.settings.llm_backend == "local":
        local = _local_model(rag)
        if local.status == "fail":
            return [local]
        return [local, *_llm_call(rag)]
    return _llm_call(rag)


def _no_llm(rag) -> Check:
    """No model set up: answers quote the abstracts. Says what is installed, and the two ways to
    generated answers (the local model, or any OpenAI-compatible server)."""
    import importlib.util

    from rag.backends.modelfiles import LOCAL_INSTALL_HINT, QWEN_FILE, qwen_parts

    runtime = importlib.util.find_spec("llama_cpp") is not None
    # The parts, or the copy joined from them (the install may have reclaimed the parts).
    joined = (rag.settings.model_cache_dir / QWEN_FILE).is_file()
    parts = joined or qwen_parts() is not None
    if runtime and parts:
        local = "the local model is installed: set RAG_LLM=local to use it (offline)"
    else:
        missing = [
            what
            for what, ok in (("llama-cpp-python", runtime), ("the model's parts", parts))
            if not ok
        ]
        local = (
            f"offline, the local model: {LOCAL_INSTALL_HINT}, then RAG_LLM=local"
            f" ({' and '.join(missing)} not installed)"
        )
    return Check(
        "llm",
        "ok",
        "none set up: answers quote the abstracts' sentences. For answers written by a model: "
        f"{local}; or a server (OpenAI, vLLM, llama.cpp, Ollama): OPENAI_BASE_URL=http://host:port/v1"
        " RAG_LLM_MODEL=name (and OPENAI_API_KEY if it asks for one); in the environment, ./.env or"
        " ~/.config/rag-papers/.env",
    )


def _llm_call(rag) -> list[Check]:
    try:
        backend = rag.llm
        backend.check_model()
        start = time.perf_counter()
        backend.complete([{"role": "user", "content": "Say OK."}])
        ms = (time.perf_counter() - start) * 1000
    except RagError as exc:
        return [Check("llm", "fail", str(exc).split("; ")[0], str(exc).split("; ")[-1])]
    return [Check("llm", "ok", f"{backend.label}: model found, a completion took {ms:.0f} ms")]
