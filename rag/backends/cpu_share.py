"""How many cores other processes took while the local model read its prompt, and so how many
threads it should write with.

llama.cpp's threads wait for each other after every token, so a thread that shares its core with a
busy process holds up the writing (then one thread can beat two: `python -m bench.llm_threads`),
while reading the prompt in big batches gains from every core. So the reading keeps every thread and
the writing gets the cores left free during it (the machine's CPU time less this process's own).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

MIN_SAMPLE_S = 0.5  # a shorter reading (a prompt mostly cached) says too little about the load


def _machine_busy_s() -> float | None:
    """CPU seconds every core has spent not idle since boot (stolen time counts: another guest had
    it; guest time is already in user time), or None where psutil cannot tell."""
    import psutil

    try:
        t = psutil.cpu_times()
    except (OSError, RuntimeError):
        return None
    return sum(t) - t.idle - sum(getattr(t, f, 0.0) for f in ("iowait", "guest", "guest_nice"))


@dataclass
class CpuSample:
    """The machine's and this process's CPU time at one moment (`CpuSample.now()`)."""

    wall: float
    machine: float | None
    own: float

    @classmethod
    def now(cls) -> CpuSample:
        return cls(time.monotonic(), _machine_busy_s(), time.process_time())

    def others_cores(self, later: CpuSample) -> float | None:
        """Cores that other processes kept busy, on average, between this sample and `later`; None
        when the machine's time is unknown or the interval is too short to tell."""
        wall = later.wall - self.wall
        if self.machine is None or later.machine is None or wall < MIN_SAMPLE_S:
            return None
        return max(0.0, (later.machine - self.machine) - (later.own - self.own)) / wall


def busy_share(others_cores: float | None, cores: int | None = None) -> float:
    """The share of its idle speed a process that uses every core gets while other processes keep
    `others_cores` busy: `cores / (cores + others)` (1 idle, 1/2 with every core taken); 1 when
    unknown. A first guess, before the process has timed its own work."""
    if others_cores is None:
        return 1.0
    cores = cores or os.cpu_count() or 1
    return cores / (cores + others_cores)


def writing_threads(others_cores: float | None, threads: int, cores: int | None = None) -> int:
    """Threads to write with: the cores the other processes left free, rounded, at least one and at
    most `threads` (the reading's); `threads` itself when the load is unknown."""
    if others_cores is None:
        return threads
    cores = cores or os.cpu_count() or 1
    return max(1, min(threads, round(cores - others_cores)))
