"""A Chroma collection another app wrote, read as a corpus (`rag ingest DIR` or
`rag ingest DIR/COLLECTION`, DIR being a Chroma directory: it holds chroma.sqlite3; or on a Chroma
server, `rag ingest http://HOST:PORT/COLLECTION`).

LlamaIndex's `ChromaVectorStore` stores one record per node: the node's text as the document, the
document's metadata flat beside `_node_content` (the node as JSON: its char offsets in the document
and the document it came from) and `document_id`. The nodes of one document are put back together
(by their offsets, or by their overlap where there are none) into one abstract, with the document's
metadata as the paper's fields (title, authors, url, venue, year, id: under the aliases of
rag/index/corpus.py). The abstracts are then chunked and embedded as any corpus file is: the
collection's own vectors may come from another model. Nothing is written to the collection.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rag.errors import CorpusError
from rag.index.vectors import read_collection, read_server_collection

CHROMA_FILE = "chroma.sqlite3"
# LlamaIndex's own keys beside a node's metadata (llama_index.core.vector_stores.utils).
LLAMAINDEX_KEYS = ("_node_content", "_node_type", "document_id", "doc_id", "ref_doc_id")
# A node's relationship to the document it came from, in `_node_content` (NodeRelationship.SOURCE).
SOURCE = "1"
# The most characters two neighbouring nodes are taken to share (LlamaIndex's overlaps are tokens).
MAX_OVERLAP = 2000
# A Chroma server's collection given as a path: "http://host:port/name" (a Path keeps one slash).
_SERVER = re.compile(r"^(https?):/+([^/\s]+)(?:/([^/\s]+))?/?$")


def server_source(path: Path) -> tuple[str, str | None] | None:
    """(server URL, collection name or None) when `path` names a collection on a Chroma server."""
    found = _SERVER.match(str(path))
    return (f"{found[1]}://{found[2]}", found[3]) if found else None


def is_chroma_source(path: Path) -> bool:
    """A Chroma directory, or DIR/NAME naming a collection in one, or a server's collection."""
    return (
        server_source(path) is not None
        or (path / CHROMA_FILE).is_file()
        or (not path.exists() and (path.parent / CHROMA_FILE).is_file())
    )


def chroma_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(ordinal, row) per document of the collection: `abstract` and the document's metadata."""
    server = server_source(path)
    own_store: Path | None = None
    if server is not None:
        name, records = read_server_collection(*server)
        where = f"{server[0]}/{name}"
    else:
        whole = (path / CHROMA_FILE).is_file()  # else DIR/COLLECTION
        directory = path if whole else path.parent
        name, records = read_collection(directory, None if whole else path.name)
        where = f"{directory}/{name}"
        own_store = directory.parent if (directory.parent / "papers.sqlite").exists() else None
    if not records:
        raise CorpusError(f"{where}: the Chroma collection is empty; nothing to ingest")
    if server is not None and _written_by_rag(records, "abstract_hash"):
        raise CorpusError(
            f"{where}: this collection holds a rag corpus (its chunks under paper ids); share it"
            f" with RAG_CHROMA_URL={server[0]} RAG_COLLECTION={name} instead of ingesting it"
        )
    if own_store is not None and _written_by_rag(records):
        # A rag store's own chroma/ (its chunks, with or without their text, under paper ids).
        raise CorpusError(
            f"{where}: this is the vector index of the rag store at {own_store};"
            f" use that store with --store {own_store}, or ingest the files it was built"
            " from"
        )
    if all(not isinstance(doc, str) or not doc.strip() for _, doc, _ in records):
        raise CorpusError(
            f"{where}: the collection holds vectors but no text (documents) to index; re-create"
            " it with LlamaIndex's ChromaVectorStore, which stores each node's text"
        )
    for n, nodes in enumerate(_documents(records), 1):
        text = _join(nodes)
        meta = {k: v for k, v in (nodes[0][2] or {}).items() if k not in LLAMAINDEX_KEYS}
        yield n, {**meta, "abstract": text}


def _written_by_rag(records: list[tuple[str, Any, Any]], *keys: str) -> bool:
    """Chunks as rag writes them: under paper ids (and, on a server, with `keys` beside)."""
    meta = records[0][2]
    return isinstance(meta, dict) and all(k in meta for k in ("paper_id", *keys))


def _node_json(meta: Any) -> dict:
    raw = meta.get("_node_content") if isinstance(meta, dict) else None
    try:
        node = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        node = {}
    return node if isinstance(node, dict) else {}


def _documents(records: list[tuple[str, Any, Any]]) -> list[list]:
    """The records grouped by the document they came from (`document_id`, else the node's SOURCE
    relationship, else the record alone), in the order of their first record; each group as
    (start offset or None, text, metadata), in document order."""
    groups: dict[str, list] = {}
    for rid, doc, meta in records:
        if not isinstance(doc, str) or not doc.strip():
            continue
        node = _node_json(meta)
        source = (node.get("relationships") or {}).get(SOURCE) or {}
        doc_id = (meta or {}).get("document_id") if isinstance(meta, dict) else None
        if not doc_id or doc_id == "None":
            doc_id = source.get("node_id") if isinstance(source, dict) else None
        start = node.get("start_char_idx")
        groups.setdefault(str(doc_id or rid), []).append(
            (start if isinstance(start, int) else None, doc, meta if isinstance(meta, dict) else {})
        )
    return [
        sorted(nodes, key=lambda n: n[0]) if all(n[0] is not None for n in nodes) else nodes
        for nodes in groups.values()
    ]


def _join(nodes: list) -> str:
    """A document's text from its nodes: laid at their offsets where all have one (overlaps
    written once), else joined where one's end repeats the next's start."""
    if all(start is not None for start, _, _ in nodes):
        text, end = "", 0
        for start, part, _ in nodes:
            if start >= end:  # a gap (whitespace the splitter dropped) is one space
                text += (" " if text and start > end else "") + part
            else:
                text += part[end - start :]
            end = max(end, start + len(part))
        return text
    text = ""
    for _, part, _ in nodes:
        overlap = next(
            (
                k
                for k in range(min(len(text), len(part), MAX_OVERLAP), 20, -1)
                if text.endswith(part[:k])
            ),
            0,
        )
        text += part[overlap:] if overlap else (" " if text else "") + part
    return text
