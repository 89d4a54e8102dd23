"""Peak memory of `rag ingest` on inputs that never end or explode (issue 31, item 3).

Each case runs the real `rag ingest FILE --store TMP` in a child and prints its exit code, peak RSS,
wall and CPU time and the one line it printed:
- `.jsonl`, `.csv` and `.json` symlinked to /dev/zero (before: the JSONL read grew to 23 GB and was
  killed);
- a gzip of 3 GB of spaces in one line (about 3 MB; before: a MemoryError traceback);
- a gzip of 3 GB of newlines (passes any line limit: the decompressed-size ratio stops it), as
  .jsonl and .csv.

The bombs are written by streaming zlib (never held whole) into a scratch directory and deleted
afterwards. Target: peak RSS under 1 GB each, one line each.

    python -m bench.speed.bounded_reads [--scratch DIR] [--gib 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

from tests.harness import run_measured


def write_gzip(path: Path, byte: bytes, gib: float) -> None:
    """`gib` GiB of one byte, gzip-compressed at level 9, written as it is compressed."""
    block = byte * 2**20
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip container
    with open(path, "wb") as out:
        for _ in range(int(gib * 1024)):
            out.write(comp.compress(block))
        out.write(comp.flush())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        default=Path("/work/scratch/reads"),
        help="where the bombs and stores go (deleted afterwards)",
    )
    parser.add_argument(
        "--gib", type=float, default=3.0, help="decompressed size of each bomb, GiB (default 3)"
    )
    args = parser.parse_args()
    args.scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bounded-reads-", dir=args.scratch))
    rag = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    print(f"load before: {os.getloadavg()[0]:.1f} (1-min average) on {os.cpu_count()} CPUs")
    try:
        cases: list[tuple[str, Path]] = []
        for suffix in (".jsonl", ".csv", ".json"):
            link = work / f"zero{suffix}"
            link.symlink_to("/dev/zero")
            cases.append((f"/dev/zero as {suffix}", link))
        for name, byte in (("spaces.jsonl.gz", b" "), ("newlines.jsonl.gz", b"\n")):
            start = time.perf_counter()
            write_gzip(work / name, byte, args.gib)
            size = (work / name).stat().st_size
            print(
                f"built {name}: {args.gib:g} GiB of {byte!r} in {size / 2**20:.1f} MiB of gzip "
                f"({time.perf_counter() - start:.0f} s)"
            )
            cases.append(
                (f"{args.gib:g} GiB gzip bomb of {byte!r} ({size / 2**20:.1f} MiB)", work / name)
            )
        csv_bomb = work / "newlines.csv.gz"
        os.link(work / "newlines.jsonl.gz", csv_bomb)
        cases.append(("the newline bomb as .csv.gz", csv_bomb))
        print(f"{'case':48s} {'exit':>4s} {'peak RSS':>10s} {'wall':>7s} {'CPU':>7s}  message")
        worst = 0.0
        for label, path in cases:
            store = work / "store"
            m = run_measured(
                [rag, "ingest", str(path), "--store", str(store)], timeout=600, new_session=True
            )
            shutil.rmtree(store, ignore_errors=True)
            lines = m.stderr.strip().splitlines()
            message = (lines[-1] if lines else "")[:150]
            worst = max(worst, m.rss_mib)
            flag = (
                ""
                if len(lines) == 1 and "Traceback" not in m.stderr
                else f"  [{len(lines)} lines on stderr]"
            )
            print(
                f"{label:48s} {m.returncode:>4d} {m.rss_mib:>7.0f} MiB {m.wall_s:>6.1f}s"
                f" {m.cpu_s:>6.1f}s  {message}{flag}"
            )
        print(f"worst peak RSS: {worst:.0f} MiB (target < 1024 MiB)")
        print(f"load after: {os.getloadavg()[0]:.1f} (1-min average)")
    finally:
        # the bombs are gigabytes once decompressed: never left behind
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
