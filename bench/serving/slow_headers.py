"""Memory of `rag serve` while unauthenticated clients trickle huge request headers (issue 31, item
3).

    python -m bench.serving.slow_headers --store DIR [--clients 10] [--mb 30] [--checkout DIR]

Starts `rag serve` (RAG_API_KEY set, extractive answers) over a copy of `--store`, reads its RSS
(VmRSS and the peak VmHWM from /proc), then opens `--clients` connections that each send `GET
/healthz` with one header of `--mb` MB in 64 kB pieces, a few ms apart, and never finish the head.
Printed: RSS before, peak during, RSS after, how much each client got to send and what it was
answered. `--checkout DIR` runs the `rag` package of another checkout (e.g. `git archive HEAD` of an
older commit) for a before figure.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.helpers import REPO
from tests.harness import free_port, popen_logged, proc_status, stop_process, wait_http_ready


def trickle(port: int, mb: int, out: dict) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    sent, answer = 0, b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(head)
            for _ in range(mb * 16):
                if select.select([sock], [], [], 0)[0]:  # answered (or closed) while still sending
                    break
                sock.sendall(b"a" * 65536)
                sent += 65536
                time.sleep(0.005)
            sock.settimeout(5)
            answer = sock.recv(200) or b"(closed without an answer)"
    except OSError as exc:
        answer = answer or f"({type(exc).__name__})".encode()
    out["sent_mb"], out["answer"] = (
        sent / 2**20,
        answer.split(b"\r\n", 1)[0].decode(errors="replace"),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--mb", type=int, default=30)
    ap.add_argument(
        "--checkout", type=Path, default=REPO, help="the checkout whose rag package serves"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="slow-headers-") as tmp:
        store = Path(tmp) / "store"
        shutil.copytree(args.store, store)
        port = free_port()
        log = Path(tmp) / "serve.log"
        env = {**os.environ, "RAG_API_KEY": "bench-key", "RAG_LLM": "none"}
        proc = popen_logged(
            [sys.executable, "-m", "rag.cli", "serve", "--store", str(store), "--port", str(port)],
            log,
            env,
            args.checkout,
        )
        try:
            wait_http_ready(proc, f"http://127.0.0.1:{port}/healthz", log, 300)
            time.sleep(1)
            before = proc_status(proc.pid)
            results = [{} for _ in range(args.clients)]
            threads = [threading.Thread(target=trickle, args=(port, args.mb, r)) for r in results]
            start = time.monotonic()
            for t in threads:
                t.start()
            peak_rss = before["VmRSS"]
            while any(t.is_alive() for t in threads):
                peak_rss = max(peak_rss, proc_status(proc.pid).get("VmRSS", 0))
                time.sleep(0.1)
            elapsed = time.monotonic() - start
            time.sleep(1)
            after = proc_status(proc.pid)
        finally:
            stop_process(proc)
    print(f"checkout: {args.checkout}")
    print(f"{args.clients} clients x {args.mb} MB header, in 64 kB pieces: {elapsed:.1f} s")
    print(
        f"RSS before: {before['VmRSS']:.0f} MiB; peak during: {peak_rss:.0f} MiB "
        f"(+{peak_rss - before['VmRSS']:.0f}); after: {after.get('VmRSS', 0):.0f} MiB; "
        f"VmHWM {before['VmHWM']:.0f} -> {after.get('VmHWM', 0):.0f} MiB"
    )
    sent = sorted(r.get("sent_mb", 0) for r in results)
    answers = sorted({r.get("answer", "?") for r in results})
    print(f"sent per client: {sent[0]:.1f}-{sent[-1]:.1f} MB; answered: {answers}")


if __name__ == "__main__":
    main()
