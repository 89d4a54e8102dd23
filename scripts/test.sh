#!/usr/bin/env bash
# The one command that runs the checks and tests: installs the test-only parts (Debian chromium, the
# llama.cpp OpenAI-compatible server and a tiny GGUF model) into the active venv, then pytest.
# Exits non-zero on any failure, including "no tests ran" (pytest's exit code 5).
#
#   bash scripts/test.sh            the full run (CI's command)
#   bash scripts/test.sh --fast     only the tests that need no real chat model, browser, server process or
#                                   big ingest (tests/conftest.py marks the rest `slow`); no install step
# Other arguments go to pytest. The 25 slowest tests are listed at the end of every run.
# Tests run on RAG_TEST_WORKERS pytest-xdist workers (default 2, one per core here; 0 runs them in this
# process), a whole test file per worker so module fixtures are built once.
set -euo pipefail
cd "$(dirname "$0")/.."
fast=()
if [[ "${1:-}" == "--fast" ]]; then
    shift
    fast=(-m "not slow")
else
    bash scripts/install_test_deps.sh
fi
# Bytecode is cached (some shells export PYTHONDONTWRITEBYTECODE): tests start ~100 cold `rag` processes and
# workers rewrite every test module's asserts, each compiling from source again without it.
unset PYTHONDONTWRITEBYTECODE
# Lint and types first: seconds, and a failure here names the line.
ruff check rag ui tests bench eval scripts
ruff format --check --quiet rag ui tests bench eval scripts
mypy
set +e
workers=(-n "${RAG_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder)  # tests/conftest.py orders the files
if [[ "${RAG_TEST_WORKERS:-2}" == "0" ]]; then workers=(-p no:xdist); fi
python -m pytest -q --durations=25 "${workers[@]}" "${fast[@]}" "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$code"
