"""What the HTTP API (`rag serve`) adds to an answer, and its throughput under concurrent clients.

    python -m bench.serving.api_latency --store DIR [--rounds 30] [--clients 20] [--seconds 20]
[--json FILE]

Extractive answers (RAG_LLM=none), so the engine's own time is small and steady and the API's share
shows.

1. Latency: the same answerable questions of eval/seed_questions.jsonl, each asked once in-process
   (`RAG.ask`, in this process) and once over HTTP (`POST /v1/chat/completions`, non-streamed, one
   keep-alive connection) to a `rag serve` subprocess over the same store, interleaved (the order
   flips every round, so drifting machine load hits both alike) in the same run. Printed: p50/p95
   (nearest rank) of each, the per-question difference (API - in-process) and the ratio of the p50s.
2. Throughput: `--clients` threads, each with its own connection, asking in a loop for `--seconds`;
   answers/s, latency p50/p95, errors. For scale, the same load in-process (`--clients` threads
   sharing one `RAG`) unless `--no-inprocess-load`.

`rag serve` runs with its default settings; the bench process and the server share the machine's
cores (the load average is printed with the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.helpers import REPO, machine_load, percentile, write_json
from tests.harness import free_port, popen_logged, stop_process, wait_http_ready


def questions(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["question"] for r in rows if r["gold"]]


def load(call: Callable[[str], None], qs: list[str], clients: int, seconds: float) -> dict:
    """`clients` threads calling `call(question)` in a loop for `seconds`: answers/s, latencies,
    errors."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def worker(i: int) -> None:
        barrier.wait()
        j = 0
        while time.monotonic() < deadline[0]:
            q = qs[(i * 7 + j) % len(qs)]
            t0 = time.perf_counter()
            try:
                call(q)
            except Exception as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
            else:
                with lock:
                    lat.append(time.perf_counter() - t0)
            j += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    deadline[0] = time.monotonic() + seconds
    start = time.monotonic()
    barrier.wait()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    return {
        "answers": len(lat),
        "wall_s": round(wall, 2),
        "per_s": round(len(lat) / wall, 2),
        "p50_s": round(percentile(lat, 50), 3) if lat else None,
        "p95_s": round(percentile(lat, 95), 3) if lat else None,
        "errors": len(errors),
        "first_errors": errors[:3],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--store", type=Path, required=True, help="a built store (e.g. `rag ingest --store DIR`)"
    )
    ap.add_argument("--questions", type=Path, default=REPO / "eval/seed_questions.jsonl")
    ap.add_argument("--rounds", type=int, default=30, help="questions timed both ways (default 30)")
    ap.add_argument(
        "--clients", type=int, default=20, help="concurrent clients for throughput (default 20)"
    )
    ap.add_argument(
        "--seconds", type=float, default=20.0, help="length of each throughput run (default 20)"
    )
    ap.add_argument(
        "--no-inprocess-load", action="store_true", help="skip the in-process throughput run"
    )
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()

    import httpx

    from rag import RAG

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "OPENAI_"))}
    env["RAG_LLM"] = "none"
    qs = questions(args.questions)
    rag = RAG(store_dir=args.store, llm="none")
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="api-latency-")
    log = Path(tmp.name) / "serve.log"
    proc = popen_logged(
        [sys.executable, "-m", "rag.cli", "serve", "--store", str(args.store), "--port", str(port)],
        log,
        env,
        REPO,
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        wait_http_ready(proc, f"http://127.0.0.1:{port}/healthz", log, 120)

        def over_http(client: httpx.Client, q: str) -> None:
            r = client.post(
                url, json={"model": "rag", "messages": [{"role": "user", "content": q}]}
            )
            r.raise_for_status()
            if r.json()["rag"]["question"] != q:
                raise RuntimeError("answer to another question")

        http = httpx.Client(trust_env=False, timeout=300)
        rag.ask(qs[0])  # warm both: models loaded, caches filled
        over_http(http, qs[0])
        local_t, api_t = [], []
        for i in range(args.rounds):
            q = qs[i % len(qs)]
            order = [("local", lambda q=q: rag.ask(q)), ("api", lambda q=q: over_http(http, q))]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                fn()
                (local_t if name == "local" else api_t).append(time.perf_counter() - t0)
        http.close()
        diffs = [a - b for a, b in zip(api_t, local_t)]
        latency = {
            "rounds": args.rounds,
            "inprocess_p50_s": round(percentile(local_t, 50), 4),
            "inprocess_p95_s": round(percentile(local_t, 95), 4),
            "api_p50_s": round(percentile(api_t, 50), 4),
            "api_p95_s": round(percentile(api_t, 95), 4),
            "added_p50_ms": round(percentile(diffs, 50) * 1000, 1),
            "added_p95_ms": round(percentile(diffs, 95) * 1000, 1),
            "ratio_p50": round(percentile(api_t, 50) / percentile(local_t, 50), 3),
        }

        local = threading.local()

        def api_call(q: str) -> None:
            if not hasattr(local, "client"):
                local.client = httpx.Client(trust_env=False, timeout=300)
            over_http(local.client, q)

        api_load = load(api_call, qs, args.clients, args.seconds)
        inproc_load = (
            None
            if args.no_inprocess_load
            else load(lambda q: rag.ask(q), qs, args.clients, args.seconds)
        )
    finally:
        stop_process(proc)
        tmp.cleanup()

    print(f"latency, extractive, {args.rounds} questions each way, interleaved ({machine_load()}):")
    print(
        f"  in-process RAG.ask   p50 {latency['inprocess_p50_s'] * 1000:7.1f} ms   p95"
        f" {latency['inprocess_p95_s'] * 1000:7.1f} ms"
    )
    print(
        f"  POST /v1/chat/compl. p50 {latency['api_p50_s'] * 1000:7.1f} ms   p95"
        f" {latency['api_p95_s'] * 1000:7.1f} ms"
    )
    print(
        f"  added by the API     p50 {latency['added_p50_ms']:7.1f} ms   p95"
        f" {latency['added_p95_ms']:7.1f} ms   (p50 ratio {latency['ratio_p50']:.3f})"
    )
    print(f"throughput, {args.clients} concurrent clients, {args.seconds:g} s:")
    for name, row in (("API", api_load), ("in-process", inproc_load)):
        if row is not None:
            print(
                f"  {name:10s} {row['answers']:4d} answers in {row['wall_s']:.1f} s ="
                f" {row['per_s']:.2f}/s; latency p50 {row['p50_s']} s, p95 {row['p95_s']} s; errors"
                f" {row['errors']}"
            )
    if args.json:
        write_json(
            args.json,
            {
                "latency": latency,
                "api_load": api_load,
                "inprocess_load": inproc_load,
                "clients": args.clients,
                "seconds": args.seconds,
                "load": machine_load(),
            },
        )
    return 1 if api_load["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
