"""Models shipped split over PyPI packages (rag/backends/modelfiles.py): all-mpnet-base-v2's split
zip, unpacked once into the model cache. The local LLM's GGUF (also joined there) is tested in
tests/test_local_model.py."""

from __future__ import annotations

import pytest

from rag.backends.modelfiles import mpnet_available, mpnet_dir
from rag.errors import StoreError

needs_mpnet = pytest.mark.skipif(not mpnet_available(), reason="needs the [mpnet] extra")


@needs_mpnet
def test_mpnet_is_unpacked_once_and_never_half(mpnet_cache, tmp_path):
    target = mpnet_dir(mpnet_cache)
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert mpnet_dir(mpnet_cache) == target  # already there: nothing is rewritten
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(mpnet_cache.glob(".unpack-*"))  # the temporary directory is gone
    # No room to unpack: a one-line error naming the fix, and nothing half-written left behind.
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(StoreError, match="RAG_MODEL_CACHE_DIR"):
        mpnet_dir(blocked / "models")


def test_mpnet_without_its_extra_says_how_to_install(tmp_path, monkeypatch):
    """Logic only: the extra's absence is simulated by asking for a package that does not exist."""
    from rag.backends import modelfiles

    monkeypatch.setattr(modelfiles, "MPNET_PARTS", ["no-such-package-part-001"])
    with pytest.raises(StoreError, match=r"pip install -e '.\[mpnet\]'"):
        mpnet_dir(tmp_path)
