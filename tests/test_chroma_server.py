"""Server mode: vectors on a real `chroma run` server (RAG_CHROMA_URL), the rest in the store dir."""

from __future__ import annotations

import json

from rag import RAG
from tests.cli_batch import run_cli_batch
from tests.conftest import run_cli


def test_ingest_and_search_against_a_chroma_server(tmp_path, small_corpus, chroma_server):
    rag = RAG(store_dir=tmp_path / "store", chroma_url=chroma_server.url, collection="server_papers", llm="none")
    report = rag.ingest([small_corpus], include_corpus=False)
    assert report.new_papers == 3
    assert not (tmp_path / "store/chroma").exists()  # no embedded Chroma: vectors are on the server
    assert rag.search("protein structure diffusion", k=1, mode="dense")[0].paper_id == "BBBBBBBBB2"
    assert "server_papers" in rag.stats()["store"]

    import chromadb

    client = chromadb.HttpClient(host=chroma_server.host, port=chroma_server.port)
    assert client.get_collection("server_papers").count() == 4

    # The CLI picks the server up from the environment, and --rebuild empties it. (Both commands in one fresh
    # process, tests/cli_batch.py: each is `rag.cli.main` with Chroma's client cache dropped before it.)
    env = {"RAG_CHROMA_URL": chroma_server.url, "RAG_COLLECTION": "server_papers"}
    store = str(tmp_path / "store")
    proc, rebuild = run_cli_batch(["search", "sparse mixture routing", "--json", "--store", store],
                                  ["ingest", str(small_corpus), "--rebuild", "--no-corpus", "--store", store], env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["paper_id"] == "AAAAAAAAA1"
    assert rebuild.returncode == 0, rebuild.stderr
    assert rebuild.stdout.startswith("indexed 3 new papers"), rebuild.stdout  # all of them again: it was emptied
    assert client.get_collection("server_papers").count() == 4


def test_unreachable_chroma_server_is_a_clear_error(tmp_path, small_corpus):
    from tests.servers import free_port

    url = f"http://127.0.0.1:{free_port()}"
    proc = run_cli("ingest", str(small_corpus), "--no-corpus", "--store", str(tmp_path / "s"),
                   env={"RAG_CHROMA_URL": url})
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith(f"rag: error: cannot reach Chroma at {url}")
