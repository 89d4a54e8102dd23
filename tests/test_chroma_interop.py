"""Chroma collections both ways (issue 51, item 2): `stats` names the Chroma path (or URL) and the
collection; a plain LlamaIndex app (`ChromaVectorStore` + `VectorStoreIndex.from_vector_store`, with
`RAG.embed_model`) queries a collection this product wrote; `rag ingest` adopts a collection
LlamaIndex wrote (its node layout), or says in one line why it cannot.

Plumbing tests: rag.testing's HashEmbedder embeds for this product and LlamaIndex's MockEmbedding
for the LlamaIndex app that wrote a collection (its vectors are never read: an adopted corpus is
embedded again), so no model loads.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math

import pytest

from rag import RAG
from rag.errors import CorpusError
from rag.testing import HashEmbedder
from tests.conftest import ICML_SAMPLE, run_cli

pytest.importorskip(
    "llama_index.vector_stores.chroma", reason="needs llama-index-vector-stores-chroma"
)

PALIMPSA = "How does Palimpsa relate to Mamba2?"
PALIMPSA_ID = "wKMV7mXjUr"


@pytest.fixture(scope="module")
def rag(tmp_path_factory):
    """The 76 seed papers embedded by HashEmbedder (about a second)."""
    r = RAG(store_dir=tmp_path_factory.mktemp("interop") / "store", embedder=HashEmbedder())
    r.ingest()
    return r


def _client(path):
    import chromadb
    from chromadb.config import Settings

    return chromadb.PersistentClient(path=str(path), settings=Settings(anonymized_telemetry=False))


def test_stats_names_the_chroma_path_and_the_collection(rag):
    stats = rag.stats()
    assert stats["chroma_path"] == str(rag.store.dir / "chroma") and stats["chroma_url"] is None
    assert stats["collection"] == "papers"
    assert [c.name for c in _client(stats["chroma_path"]).list_collections()] == ["papers"]


def _llamaindex_index(rag):
    """What a plain LlamaIndex app does with this product's collection."""
    from llama_index.core import VectorStoreIndex
    from llama_index.vector_stores.chroma import ChromaVectorStore

    stats = rag.stats()
    collection = _client(stats["chroma_path"]).get_collection(stats["collection"])
    return VectorStoreIndex.from_vector_store(
        ChromaVectorStore(chroma_collection=collection), embed_model=rag.embed_model
    )


def test_a_llamaindex_app_queries_this_products_collection(rag):
    """Same vectors, same embedder: LlamaIndex's nearest chunks are this product's dense hits, and
    each node names its paper."""
    nodes = _llamaindex_index(rag).as_retriever(similarity_top_k=5).retrieve(PALIMPSA)
    dense = rag.search(PALIMPSA, k=5, mode="dense")
    found = list(dict.fromkeys(n.node.metadata["paper_id"] for n in nodes))
    assert found[:3] == [s.paper_id for s in dense[:3]]
    assert nodes[0].score == pytest.approx(math.exp(-(1 - dense[0].score)), abs=1e-3)
    # The paper's metadata, from the id on the node.
    paper = rag.papers(found[0])[0]
    assert paper.title == dense[0].title


def test_llamaindex_nodes_carry_the_text_and_the_papers_fields(rag):
    node = _llamaindex_index(rag).as_retriever(similarity_top_k=1).retrieve(PALIMPSA)[0].node
    paper = rag.papers(node.metadata["paper_id"])[0]
    assert node.get_content().startswith(paper.title) and node.metadata["title"] == paper.title
    assert node.metadata.get("url") == paper.url


# ---- adopting a LlamaIndex-written collection ---------------------------------------------------


def _rows(n: int) -> list[dict]:
    """The first n ICML 2026 records with an OpenReview id (a few have none)."""
    with gzip.open(ICML_SAMPLE, "rt", encoding="utf-8") as fh:
        rows = (json.loads(line) for line in fh)
        return list(itertools.islice((r for r in rows if r["id"]), n))


def _llamaindex_collection(path, rows, name="abstracts", chunk_size=64, client=None):
    """A collection written as a LlamaIndex quickstart writes one: Documents with metadata, split
    by SentenceSplitter (several nodes per abstract), stored by ChromaVectorStore (in the Chroma
    directory `path`, or through `client`)."""
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.vector_stores.chroma import ChromaVectorStore

    fields = ["title", "url", "authors", "venue"]
    docs = [
        Document(
            text=r["abstract"],
            metadata={
                "title": r["title"],
                "url": r["url"],
                "authors": ", ".join(r["authors"]),
                "venue": r["venue"],
            },
            excluded_embed_metadata_keys=fields,
            excluded_llm_metadata_keys=fields,
        )
        for r in rows
    ]
    collection = (client or _client(path)).get_or_create_collection(name)
    VectorStoreIndex.from_documents(
        docs,
        storage_context=StorageContext.from_defaults(
            vector_store=ChromaVectorStore(chroma_collection=collection)
        ),
        embed_model=MockEmbedding(embed_dim=8),
        transformations=[SentenceSplitter(chunk_size=chunk_size, chunk_overlap=10)],
    )
    return collection


def test_ingest_adopts_a_llamaindex_collection(tmp_path):
    rows = _rows(5)
    collection = _llamaindex_collection(tmp_path / "chroma_db", rows)
    assert collection.count() > len(rows)  # several nodes per abstract
    r = RAG(store_dir=tmp_path / "store", embedder=HashEmbedder(), llm="none")
    report = r.ingest(tmp_path / "chroma_db", include_corpus=False)
    assert report.new_papers == len(rows)
    papers = {p.paper_id: p for p in r.papers([row["id"] for row in rows])}
    for row in rows:  # ids from the OpenReview urls, as for any corpus file
        paper = papers[row["id"]]
        assert (paper.title, paper.url, paper.venue) == (row["title"], row["url"], row["venue"])
        assert paper.authors == row["authors"]
    # Each abstract put back together from its nodes, character for character.
    abstracts = {a for _, _, _, _, _, a in _chunks(r)}
    assert abstracts == {" ".join(row["abstract"].split()) for row in rows}
    top = r.search(rows[2]["title"], k=1)[0]
    assert top.paper_id == rows[2]["id"]
    # Named as DIR/COLLECTION too; nothing new the second time.
    again = r.ingest(tmp_path / "chroma_db" / "abstracts", include_corpus=False)
    assert again.new_papers == 0 and again.already_indexed == len(rows)


def _chunks(r):
    return r.store._db().execute(
        "SELECT chunk_id, paper_id, abstract_hash, seq, text, abstract FROM chunks"
    )


def test_nodes_without_offsets_are_joined_by_their_overlap():
    from rag.index.adopt import _join

    text = "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron."
    parts = [text[:45], text[20:70], text[45:]]  # 25 characters shared
    assert _join([(None, p, {}) for p in parts]) == text
    assert _join([(0, text[:40], {}), (25, text[25:70], {}), (55, text[55:], {})]) == text
    assert _join([(0, "Two parts", {}), (10, "far apart.", {})]) == "Two parts far apart."


def test_ingest_says_why_it_cannot_adopt(tmp_path, rag):
    rows = _rows(2)
    _llamaindex_collection(tmp_path / "two", rows, name="first")
    _llamaindex_collection(tmp_path / "two", rows, name="second")
    target = RAG(store_dir=tmp_path / "store", embedder=HashEmbedder(), llm="none")
    cases = [
        (tmp_path / "two", "holds 2 Chroma collections (first, second); name one as"),
        (tmp_path / "two" / "third", "no Chroma collection 'third' in"),
        (rag.store.dir / "chroma", f"this is the vector index of the rag store at {rag.store.dir}"),
    ]
    bare = _client(tmp_path / "bare").get_or_create_collection("vectors")
    bare.add(ids=["a"], embeddings=[[0.1, 0.2]], metadatas=[{"title": "T"}])
    cases.append((tmp_path / "bare", "holds vectors but no text (documents) to index"))
    _client(tmp_path / "empty").get_or_create_collection("nothing")
    cases.append((tmp_path / "empty", "the Chroma collection is empty; nothing to ingest"))
    for path, message in cases:
        with pytest.raises(CorpusError) as caught:
            target.ingest(path, include_corpus=False)
        said = str(caught.value)
        assert said.startswith(str(path)) and message in said and "\n" not in said, said
    assert not target.store.exists() or target.store.paper_count() == 0


def test_rag_ingest_adopts_a_collection_on_a_chroma_server(tmp_path, chroma_server):
    """`rag ingest http://HOST:PORT/COLLECTION`, against a real `chroma run`: a LlamaIndex app's
    collection on the server is adopted as it is from a directory; a rag corpus shared there, a
    missing collection and a server that is not up each get one line naming the fix."""
    import chromadb

    client = chromadb.HttpClient(host=chroma_server.host, port=chroma_server.port)
    rows = _rows(3)
    _llamaindex_collection(None, rows, name="li_papers", client=client)
    store = tmp_path / "s"
    proc = run_cli("ingest", f"{chroma_server}/li_papers", "--store", str(store), "--no-corpus")
    assert proc.returncode == 0, proc.stderr
    r = RAG(store_dir=store, llm="none")  # the bundled model `rag ingest` embedded with
    assert {p.paper_id for p in r.papers([row["id"] for row in rows])} == {
        row["id"] for row in rows
    }
    assert client.get_collection("li_papers").count() > len(rows)  # nothing taken from it

    ragish = client.get_or_create_collection("ragish")
    ragish.add(
        ids=["p:h:0"],
        embeddings=[[0.1, 0.2]],
        documents=["An abstract."],
        metadatas=[{"paper_id": "p", "abstract_hash": "h", "seq": 0, "n_chunks": 1}],
    )
    down = "http://127.0.0.1:9/papers"  # the discard port: nothing listens
    for source, message in [
        (f"{chroma_server}/ragish", f"RAG_CHROMA_URL={chroma_server} RAG_COLLECTION=ragish"),
        (f"{chroma_server}/absent", "no Chroma collection 'absent' in"),
        (down, "cannot reach Chroma at http://127.0.0.1:9"),
    ]:
        proc = run_cli("ingest", source, "--store", str(tmp_path / "t"), "--no-corpus")
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
        assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_rag_ingest_refuses_in_one_line(tmp_path):
    _llamaindex_collection(tmp_path / "db", _rows(1), name="first")
    _llamaindex_collection(tmp_path / "db", _rows(1), name="second")
    proc = run_cli("ingest", str(tmp_path / "db"), "--store", str(tmp_path / "s"), "--no-corpus")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0
    assert f"name one as {tmp_path / 'db'}/COLLECTION" in proc.stderr


def test_without_text_the_collection_keeps_the_papers_ids_and_titles(tmp_path, small_corpus):
    """`RAG_CHROMA_TEXT=false` (a large corpus no other app reads): no documents in embedded
    Chroma, a third of its size, and answers as before."""
    small = RAG(store_dir=tmp_path / "s", embedder=HashEmbedder(), llm="none", chroma_text=False)
    small.ingest([small_corpus], include_corpus=False)
    stats = small.stats()
    got = (
        _client(stats["chroma_path"])
        .get_collection(stats["collection"])
        .get(include=["documents", "metadatas"])
    )
    assert got["ids"] and all(not d for d in got["documents"])
    assert all(m["paper_id"] and m["title"] for m in got["metadatas"])
    assert small.search("mixture of experts routing", k=1)
