"""What several benchmarks share: ONE percentile definition, the repository's paths, the machine's
load (every timing says whether the machine was busy) and writing a JSON result. Standard library
only.

Processes and servers (run_measured, free_port, ...) live in `tests/harness.py`, shared with the
tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, q in 0..100: the smallest value with at least q% of the values at or
    below it (the ceil(q/100 * n)-th smallest; q=0 gives the minimum). NaN for no values. Every
    bench reports p50, p95 and the like with this one rule, so figures from different scripts
    compare rank for rank."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q={q} is outside 0..100 (write 95 for p95, not 0.95)")
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of the share hits / n ((0, 0) for none)."""
    if not n:
        return (0.0, 0.0)
    p = hits / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return ((centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n))


def machine_load() -> str:
    """The load averages (1, 5, 15 min) and core count, as `uptime` would say them: printed beside
    timings, since other processes on a shared machine slow them down."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def busy() -> bool:
    """Whether the 1-minute load average is above the core count (wall times are then inflated)."""
    return os.getloadavg()[0] > (os.cpu_count() or 1)


def write_json(path: Path, data: Any, indent: int | None = 2) -> None:
    """Write a result as UTF-8 JSON ending in a newline."""
    Path(path).write_text(json.dumps(data, indent=indent) + "\n", encoding="utf-8")


def apparent_size_mib(path: Path) -> float:
    """The sum of the files' sizes under `path` (what the bytes take, not the disk blocks), in
    MiB."""
    return (
        sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())
        / 2**20
    )


def disk_usage_mib(path: Path) -> float:
    """The disk blocks `path` takes (`du -sk`), in MiB; 0 for a missing path, the apparent size when
    du fails."""
    if not Path(path).exists():
        return 0.0
    try:
        out = subprocess.run(
            ["du", "-sk", str(path)], capture_output=True, text=True, check=True
        ).stdout
        return int(out.split()[0]) / 1024
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return apparent_size_mib(path)


def report(result: dict[str, Any], out: Path | None) -> None:
    """Print a benchmark's figures one per line (floats to 3 places) and write them to `out` as JSON
    if given."""
    width = max(map(len, result), default=0) + 2
    for key, value in result.items():
        print(
            f"{key:{width}s} {value:.3f}" if isinstance(value, float) else f"{key:{width}s} {value}"
        )
    if out:
        write_json(out, result)


class Recorded:
    """A chat model that forwards to `inner` and keeps each streamed reply by its prompt, so that a
    second engine (a rule turned off) reads the same reply without asking the model again: a model
    at temperature 0 writes the same reply to the same prompt, so the replay is what it would write.
    A reply the answer broke off early is kept as far as it was read. With `path`, the replies are
    kept in that file too and read from it first: a run can be judged again without the model."""

    def __init__(self, inner, path: Path | None = None) -> None:
        self.inner, self.path = inner, path
        self.replies: dict[str, list] = {}
        if path is not None and path.exists():  # a run's replies, to judge them again offline
            self.replies = json.loads(path.read_text())

    @property
    def label(self) -> str:
        return self.inner.label

    def check_model(self) -> None:
        self.inner.check_model()

    def stream(self, messages):
        key = json.dumps(messages, sort_keys=True)
        if key in self.replies:
            yield from self.replies[key]
            return
        pieces: list = []
        try:
            for piece in self.inner.stream(messages):
                pieces.append(piece)
                yield piece
        finally:
            self.replies[key] = [p for p in pieces if isinstance(p, str)]
            if self.path is not None:
                self.path.write_text(json.dumps(self.replies))

    def complete(self, messages) -> str:
        return self.inner.complete(messages)

    def yes_probability(self, messages) -> float:
        return self.inner.yes_probability(messages)

    def cost(self, prompt_tokens: int, completion_tokens: int):
        return self.inner.cost(prompt_tokens, completion_tokens)


def halves(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """A question set's halves by its `heldout` flag (tuned on, held out), then all of it."""
    return [
        ("tuned", [r for r in rows if not r["heldout"]]),
        ("held out", [r for r in rows if r["heldout"]]),
        ("all", rows),
    ]
