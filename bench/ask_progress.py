"""What a person at a terminal waits for: `rag ask` run as a user runs it, idle and with the CPU busy.

    RAG_LLM=local python -m bench.ask_progress --store DIR [--questions FILE] [--n 8] [--busy 0,2] [--json OUT]

Each question is one fresh `rag ask` process (the model loads each time, as it does for a user), its
stderr on a pseudo-terminal (so it shows its status lines) and its stdout on a pipe. Per run: the first
status line (from the process start), the first word of the answer, the whole answer. `--busy N` runs
N processes that keep a core busy each (plain Python loops, niced like nothing: a user's other work)
for the whole pass; passes are idle first, then busy. Prints p50/p95 (nearest rank) per pass and the ratio of each
busy pass to the idle one. The machine's load average is printed before each pass.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import selectors
import subprocess
import sys
import time
from pathlib import Path

from bench.helpers import REPO, percentile, write_json


def one(question: str, store: Path, timeout: float) -> dict:
    exe = str(Path(sys.executable).parent / "rag")
    master, slave = pty.openpty()
    start = time.perf_counter()
    proc = subprocess.Popen([exe, "ask", "--store", str(store), question], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    sel = selectors.DefaultSelector()
    sel.register(master, selectors.EVENT_READ, "err")
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    status = word = None
    out = b""
    open_fds = 2
    while open_fds and time.perf_counter() - start < timeout:
        for key, _ in sel.select(timeout=0.5):
            try:
                data = os.read(key.fd, 4096)
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                open_fds -= 1
                continue
            now = time.perf_counter() - start
            if key.data == "err" and status is None and b"rag:" in data:
                status = now
            if key.data == "out":
                out += data
                if word is None and out.strip():
                    word = now
    try:
        proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:  # reported as timed out, the pass goes on
        proc.kill()
        proc.wait()
    os.close(master)
    total = time.perf_counter() - start
    return {"question": question, "status": status, "first_word": word, "total": total if total < timeout else None,
            "exit": proc.returncode, "timed_out": total >= timeout}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/user_questions.jsonl")
    ap.add_argument("--n", type=int, default=8, help="answerable questions, spread over the file")
    ap.add_argument("--busy", default="0,2", help="passes: how many busy processes in each (0: idle)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["gold"]]
    rows = rows[:: max(1, len(rows) // args.n)][: args.n]
    result: dict = {"passes": []}
    for busy in (int(b) for b in args.busy.split(",")):
        hogs = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 3600\n"
                                  "while time.time() < end: pass"]) for _ in range(busy)]
        try:
            time.sleep(2 if busy else 0)
            load = os.getloadavg()
            runs = [one(r["question"], args.store, args.timeout) for r in rows]
        finally:
            for h in hogs:
                h.kill()
        figures = {name: (percentile([r[name] for r in runs if r[name] is not None], 50),
                          percentile([r[name] for r in runs if r[name] is not None], 95))
                   for name in ("status", "first_word", "total")}
        result["passes"].append({"busy": busy, "load_before": load, "figures": figures, "runs": runs})
        late = sum(r["timed_out"] for r in runs)
        print(f"busy processes {busy} (load average before: {load[0]:.2f}), {len(runs)} questions"
              + (f", {late} not done after {args.timeout:.0f} s (left out of the figures)" if late else "") + ":")
        for name, (p50, p95) in figures.items():
            print(f"    {name:10s} p50 {p50:6.2f} s   p95 {p95:6.2f} s")
    idle = result["passes"][0]["figures"]
    for p in result["passes"][1:]:
        print(f"busy {p['busy']} / idle, p50: " + ", ".join(
            f"{name} {p['figures'][name][0] / idle[name][0]:.2f}x" for name in idle if idle[name][0]))
    if args.json:
        write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
