"""What a person at a terminal waits for: `rag ask` run as a user runs it, idle and with the CPU
busy.

    RAG_LLM=local python -m bench.speed.ask_progress --store DIR [--questions FILE] [--n 8] [--busy
0,2] [--json OUT] [--compare "RAG_X=a" "RAG_X=b RAG_Y=c"]

Each question is one fresh `rag ask` process (the model loads each time, as it does for a user), its
stderr on a pseudo-terminal (so it shows its status lines) and its stdout on a pipe. Per run: the
first status line (from the process start), the papers found shown, the first word of the answer
(its first checked text), the whole answer, the time from the first word to the end, and the reading
as estimated (the first "about N s left") against the reading as it went (from the papers shown to
the model's first token, "is writing"). `--busy N` runs N processes that
keep a core busy each (plain Python loops, niced like nothing: a user's other work) for the whole
pass; passes are idle first, then busy. Prints p50/p95 (nearest rank) per pass and the ratio of each
busy pass to the idle one. The machine's load average is printed before each pass. `--compare` runs
each question once per setting (environment assignments), the settings in turn question by question
(the order turned round on every other question), so that a load that comes and goes falls on each
alike; the figures are per setting, with each setting's ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

from bench.helpers import REPO, percentile, write_json


def one(question: str, store: Path, timeout: float, setting: str = "") -> dict:
    exe = str(Path(sys.executable).parent / "rag")
    env = {**os.environ, **dict(pair.split("=", 1) for pair in setting.split())}
    master, slave = pty.openpty()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [exe, "ask", "--store", str(store), question],
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(slave)
    sel = selectors.DefaultSelector()
    sel.register(master, selectors.EVENT_READ, "err")
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    status = word = papers = writing = estimate = None
    out = err = b""
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
            if key.data == "err":
                err += data
                status = status if status is not None or b"rag:" not in err else now
                papers = papers if papers is not None or b"rag: found" not in err else now
                writing = writing if writing is not None or b"is writing" not in err else now
                if estimate is None and (m := re.search(rb"about (\d+) s left", err)):
                    estimate = float(m.group(1))
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
    done = total < timeout
    return {
        "question": question,
        "status": status,
        "papers": papers,
        "first_word": word,
        "estimate": estimate,
        "reading": writing - papers if writing is not None and papers is not None else None,
        "total": total if done else None,
        "after_first_word": total - word if done and word is not None else None,
        "exit": proc.returncode,
        "timed_out": total >= timeout,
        "setting": setting,
    }


def p50_p95(runs: list[dict]) -> dict[str, tuple[float, float]]:
    return {
        name: (
            percentile([r[name] for r in runs if r[name] is not None], 50),
            percentile([r[name] for r in runs if r[name] is not None], 95),
        )
        for name in ("status", "papers", "first_word", "total", "after_first_word", "reading")
    } | {
        "estimate/reading": (
            percentile(
                [r["estimate"] / r["reading"] for r in runs if r["estimate"] and r["reading"]], 50
            ),
            percentile(
                [r["estimate"] / r["reading"] for r in runs if r["estimate"] and r["reading"]], 95
            ),
        )
    }


def interleaved(rows: list[dict], settings: list[str], store: Path, timeout: float) -> list[dict]:
    """Each question once per setting, the settings' order turned round on every other question."""
    runs = []
    for i, row in enumerate(rows):
        for setting in settings if i % 2 == 0 else settings[::-1]:
            runs.append(one(row["question"], store, timeout, setting))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--questions", type=Path, default=REPO / "eval/user_questions.jsonl")
    ap.add_argument("--n", type=int, default=8, help="answerable questions, spread over the file")
    ap.add_argument(
        "--busy", default="0,2", help="passes: how many busy processes in each (0: idle)"
    )
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--compare",
        nargs="+",
        default=[""],
        metavar="SETTING",
        help=(
            "settings to compare, each a space-separated list of NAME=VALUE environment assignments"
        ),
    )
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["gold"]]
    rows = rows[:: max(1, len(rows) // args.n)][: args.n]
    result: dict = {"passes": []}
    for busy in (int(b) for b in args.busy.split(",")):
        hogs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import time\nend = time.time() + 3600\nwhile time.time() < end: pass",
                ]
            )
            for _ in range(busy)
        ]
        try:
            time.sleep(2 if busy else 0)
            load = os.getloadavg()
            runs = interleaved(rows, args.compare, args.store, args.timeout)
        finally:
            for h in hogs:
                h.kill()
        figures = {
            setting: p50_p95([r for r in runs if r["setting"] == setting])
            for setting in args.compare
        }
        result["passes"].append(
            {"busy": busy, "load_before": load, "figures": figures, "runs": runs}
        )
        late = sum(r["timed_out"] for r in runs)
        print(
            f"busy processes {busy} (load average before: {load[0]:.2f}), {len(rows)} questions"
            + (
                f", {late} runs not done after {args.timeout:.0f} s (left out of the figures)"
                if late
                else ""
            )
            + ":"
        )
        first = figures[args.compare[0]]
        for setting, figs in figures.items():
            if len(args.compare) > 1:
                print(f"  {setting or '(as configured)'}:")
            for name, (p50, p95) in figs.items():
                ratio = (
                    f"   {p50 / first[name][0]:.2f}x the first setting"
                    if setting != args.compare[0] and first[name][0]
                    else ""
                )
                unit = "" if "/" in name else " s"
                print(f"    {name:16s} p50 {p50:6.2f}{unit}   p95 {p95:6.2f}{unit}{ratio}")
    idle = result["passes"][0]["figures"]
    for p in result["passes"][1:]:
        for setting in args.compare:
            print(
                f"busy {p['busy']} / idle, p50{' ' + setting if setting else ''}: "
                + ", ".join(
                    f"{name} {p['figures'][setting][name][0] / idle[setting][name][0]:.2f}x"
                    for name in idle[setting]
                    if idle[setting][name][0]
                )
            )
    if args.json:
        write_json(args.json, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
