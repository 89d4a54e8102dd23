"""How fast the local model reads and writes with each thread count, idle or beside busy processes.

    python -m bench.speed.llm_threads --busy 0 --threads 1/2,2/2  # writing / reading threads

The model alone (no retrieval): a ~650-token prompt (the README's start, "summarise in many
sentences"), 60 tokens written, twice per setting. `--busy N` runs N processes that keep a core busy
each (plain Python loops) for the whole run. Prints the time to the first token (the reading) and
the writing rate.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.helpers import REPO


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--busy", type=int, default=0, help="processes keeping a core busy each")
    ap.add_argument(
        "--threads",
        default="1/2,2/2",
        help="settings: writing threads/reading threads, comma-separated",
    )
    args = ap.parse_args()
    import llama_cpp

    from rag.backends.modelfiles import qwen_gguf
    from rag.config import Settings

    path = qwen_gguf(Settings().model_cache_dir)
    text = (REPO / "README.md").read_text()[:2400]
    hogs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time\nend = time.time() + 900\nwhile time.time() < end: pass",
            ]
        )
        for _ in range(args.busy)
    ]
    try:
        time.sleep(2 if hogs else 0)
        print(f"load average before: {os.getloadavg()[0]:.2f}; busy processes {args.busy}")
        for setting in args.threads.split(","):
            write, read = (int(n) for n in setting.split("/"))
            llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=4096,
                n_threads=write,
                n_threads_batch=read,
                n_batch=512,
                verbose=False,
            )
            for i in range(2):  # a different first word each time: nothing of the prompt is reused
                messages = [
                    {
                        "role": "user",
                        "content": f"({i}) Summarise this text in many sentences:\n\n{text}",
                    }
                ]
                start, first, n = time.perf_counter(), None, 0
                for chunk in llm.create_chat_completion(
                    messages=messages, stream=True, temperature=0, max_tokens=60
                ):
                    if chunk["choices"][0].get("delta", {}).get("content"):
                        n += 1
                        first = first or time.perf_counter() - start
                total = time.perf_counter() - start
                first = first or total
                print(
                    f"writing threads {write}, reading threads {read}: first token {first:.1f} s,"
                    f" writing {n / max(total - first, 1e-9):.1f} tokens/s",
                    flush=True,
                )
            del llm
    finally:
        for hog in hogs:
            hog.kill()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
