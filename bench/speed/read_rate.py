"""How fast the local model reads a prompt, with the llama.cpp build installed in this venv.

    python -m bench.speed.read_rate [--threads 2]

Evaluates 200, 400 and 800 tokens of a seed abstract file into a fresh context of
Qwen2.5-Coder-1.5B-Instruct (the `[local]` extra) and prints tokens per second for each, then the
CPU kernels llama.cpp was built with (`AVX512 = 1` when scripts/install_local_llm.sh found AVX-512).
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.helpers import REPO


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp

    from rag.backends.modelfiles import qwen_gguf
    from rag.config import Settings

    llm = llama_cpp.Llama(
        model_path=str(qwen_gguf(Settings().model_cache_dir)),
        n_ctx=4096,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_batch=512,
        verbose=False,
    )
    text = next(iter(sorted((REPO / "corpus").glob("*.txt")))).read_text()
    tokens = llm.tokenize(text.encode())
    for n in (200, 400, 800):
        llm.reset()
        start = time.perf_counter()
        llm.eval(tokens[:n])
        print(
            f"{n} tokens: {n / (time.perf_counter() - start):.0f} tokens/s ({args.threads} threads)"
        )
    print(llama_cpp.llama_print_system_info().decode().strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
