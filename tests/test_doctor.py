"""`rag doctor` on healthy and broken setups (real store, real servers)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli


def _checks(proc) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(proc.stdout)}


def test_healthy_store_without_llm(seed_store):
    proc = run_cli("doctor", "--json", "--store", str(seed_store))
    assert proc.returncode == 0, proc.stderr
    checks = _checks(proc)
    assert {c["status"] for c in checks.values()} == {"ok"}
    assert checks["store"]["detail"].startswith("76 papers")
    # No model set up: it says so, what is installed, and both ways to set one up.
    llm = checks["llm"]["detail"]
    assert "answers quote the abstracts" in llm
    assert "RAG_LLM=local" in llm and "OPENAI_BASE_URL=" in llm and "RAG_LLM_MODEL=" in llm
    assert "the local model is installed" in llm or "not installed" in llm


def test_llm_endpoint_checked_for_real(seed_store, llama_server):
    env = {"OPENAI_BASE_URL": llama_server.base_url, "RAG_LLM_MODEL": llama_server.model}
    proc = run_cli("doctor", "--store", str(seed_store), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "model found, a completion took" in proc.stdout
    bad = run_cli("doctor", "--store", str(seed_store), env={**env, "RAG_LLM_MODEL": "nope"})
    assert bad.returncode == 1
    assert (
        "FAIL  llm: model 'nope' is not served" in bad.stdout
        and "fix: check RAG_LLM_MODEL" in bad.stdout
    )


def test_unreachable_llm_and_empty_store(tmp_path):
    from tests.servers import free_port

    env = {"OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1", "RAG_LLM_RETRIES": "0"}
    proc = run_cli("doctor", "--json", "--store", str(tmp_path / "none"), env=env)
    assert proc.returncode == 1
    checks = _checks(proc)
    assert checks["store"]["status"] == "fail" and "rag ingest" in checks["store"]["fix"]
    assert checks["llm"]["status"] == "fail" and "OPENAI_BASE_URL" in checks["llm"]["fix"]


def test_store_problems_are_named(tmp_path, seed_store):
    store = tmp_path / "store"
    shutil.copytree(seed_store, store)
    from rag import RAG

    rag = RAG(store_dir=store)
    vector = rag.embedder.embed(["orphan"])[0]
    rag.store.collection().upsert(
        ids=["ORPHAN:0:0"], embeddings=[vector], metadatas=[{"paper_id": "ORPHAN"}]
    )
    checks = _checks(run_cli("doctor", "--json", "--store", str(store)))
    assert (
        checks["vectors"]["status"] == "warn"
        and "1 vectors without a committed chunk" in checks["vectors"]["detail"]
    )
    other = run_cli(
        "doctor", "--store", str(store), env={"RAG_EMBED_MODEL": "openai:text-embedding-3-small"}
    )
    assert (
        other.returncode == 1
        and "FAIL  store: the index at" in other.stdout
        and "rag repair --store" in other.stdout
    )
    assert "--rebuild" not in other.stdout  # the fix keeps the papers


@pytest.mark.slow
def test_local_model_is_verified_and_loaded(seed_store, tmp_path):
    """RAG_LLM=local: doctor re-hashes the bundled Qwen GGUF, loads it in-process and gets a
    completion; a RAG_LOCAL_MODEL_PATH that does not exist is one failed check naming the setting.
    """
    from rag.backends.modelfiles import qwen_parts
    from tests.servers import _unavailable

    if qwen_parts() is None:
        _unavailable("the [local] extra (Qwen2.5-Coder-1.5B-Instruct) is not installed")
    proc = run_cli("doctor", "--json", "--store", str(seed_store), env={"RAG_LLM": "local"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = _checks(proc)
    assert checks["local model"]["status"] == "ok" and "verified" in checks["local model"]["detail"]
    assert checks["llm"]["detail"].startswith("qwen2.5-coder-1.5b-instruct")
    bad = run_cli(
        "doctor",
        "--json",
        "--store",
        str(seed_store),
        env={"RAG_LLM": "local", "RAG_LOCAL_MODEL_PATH": str(tmp_path / "none.gguf")},
    )
    assert bad.returncode == 1 and _checks(bad)["local model"]["fix"].startswith(
        "set RAG_LOCAL_MODEL_PATH"
    )
