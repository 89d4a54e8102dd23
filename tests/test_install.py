"""A plain install works anywhere: the wheel is built, installed into a fresh virtual environment
and `rag ask` runs from an empty directory, with the seed corpus shipped inside the package and the
default index in the per-user data directory, never inside site-packages.

The fresh venv reuses this environment's installed dependencies through a `.pth` line (these
machines cannot download them again in a test), but not this checkout: the project itself comes only
from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it

REPO = Path(__file__).resolve().parent.parent
_SKIP = {".git", ".venv", "store", "build", "artifacts", "results", "__pycache__", ".ci"}


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv holding the project's wheel (and nothing else of it); returns its `bin/`."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=lambda d, names: [n for n in names if n in _SKIP or n.endswith(".egg-info")],
    )
    wheels = tmp / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The dependencies from this environment: a plain path line, so its own .pth files (this
    # checkout's editable install among them) are not processed.
    (_site_packages(python) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    wheel = next(wheels.glob("rag_papers-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return venv / "bin"


def _clean_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAG_", "OPENAI_", "XDG_", "PYTHON"))
    }
    return env | {"HOME": str(home), "PATH": os.environ["PATH"]}


def test_the_wheel_answers_from_an_empty_directory(installed, tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "empty"
    home.mkdir()
    cwd.mkdir()
    proc = subprocess.run(
        [str(installed / "rag"), "ask", "How does Palimpsa relate to Mamba2?"],
        cwd=cwd,
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[1]" in proc.stdout and "Palimpsa" in proc.stdout
    # The index went to the per-user data directory, built from the seeds inside the package.
    store = home / ".local" / "share" / "rag-papers" / "store"
    assert (store / "papers.sqlite").is_file()
    assert not list(cwd.iterdir()), "nothing is written to the working directory"
    site = _site_packages(installed / "python")
    assert (site / "rag" / "seeds" / "seed_metadata.jsonl").is_file()
    assert not (site / "store").exists() and not (site / "rag" / "store").exists()
    # The code came from the wheel, not from this checkout.
    where = subprocess.run(
        [str(installed / "python"), "-c", "import rag; print(rag.__file__)"],
        cwd=cwd,
        env=_clean_env(home),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(site) in where and str(REPO) not in where

    stats = subprocess.run(
        [str(installed / "rag"), "stats", "--json"],
        cwd=cwd,
        env=_clean_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stats.returncode == 0, stats.stderr
    assert '"papers": 76' in stats.stdout and str(store) in stats.stdout


def test_rag_store_dir_still_wins_over_the_data_directory(installed, tmp_path):
    home, cwd, store = tmp_path / "home", tmp_path / "empty", tmp_path / "mine"
    home.mkdir()
    cwd.mkdir()
    env = _clean_env(home) | {"RAG_STORE_DIR": str(store)}
    # One paper, not the 76 seeds: where the index goes is the question, not how long it takes to
    # build.
    paper = tmp_path / "one.jsonl"
    paper.write_text(
        '{"id": "p1", "title": "Sparse experts", "abstract": "We prune experts in mixtures."}\n'
    )
    proc = subprocess.run(
        [str(installed / "rag"), "ingest", str(paper), "--no-corpus"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert (store / "papers.sqlite").is_file() and "1 new paper" in proc.stdout, proc.stdout
    assert not (home / ".local" / "share" / "rag-papers").exists()
