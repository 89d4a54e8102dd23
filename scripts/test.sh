#!/usr/bin/env bash
# The one command that runs the checks and tests: installs the test-only parts (Debian chromium, the
# llama.cpp OpenAI-compatible server and a tiny GGUF model) into the active venv, then pytest.
# Exits non-zero on any failure, including "no tests ran" (pytest's exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_test_deps.sh
# Lint and types first: seconds, and a failure here names the line.
ruff check rag ui tests bench eval scripts
mypy
set +e
python -m pytest -q "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "test.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$code"
