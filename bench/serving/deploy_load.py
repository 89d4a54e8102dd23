"""Two `rag serve` replicas on one Chroma server, under load, while a third process adds papers.

    python -m bench.serving.deploy_load [--base 2000] [--new 1000] [--clients 20] [--seconds 60] \
        [--json OUT]
    python -m bench.serving.deploy_load --procfile ...  # deploy/ (honcho + nginx), via its proxy

Starts `chroma run` on loopback, fills its collection with `--base` ICML 2026 abstracts
(`../shared/data`) through one store, then starts two `rag serve` replicas, each on an empty store
directory pointed at the same collection (extractive answers, RAG_LLM=none). `--clients` threads
search (POST /v1/search, k=5) by the titles of base papers, alternating replicas, for `--seconds`; a
few seconds in, a third process ingests `--new` more abstracts into the collection. Printed:
requests, errors, latency p50/p95, results naming a paper that is in neither set (must be 0), the
ingest's time, and for each replica how long after the ingest finished it first found a new paper by
its title (target: within 30 s). Prints the machine's load.

With `--procfile` the servers are deploy/Procfile's, started by `honcho` (`pip install honcho`;
nginx from the distribution) with deploy/replicas.env's variables on free loopback ports and an API
key, and every client request goes through the nginx proxy; the replicas are probed directly for the
new paper.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.helpers import REPO, SHARED_DATA, machine_load, percentile, report


def _records(n: int, skip: int = 0) -> list[dict]:
    with gzip.open(SHARED_DATA / "icml2026_main.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in itertools.islice(fh, skip, skip + n)]


API_KEY = "bench-deploy-key"  # the --procfile deployment's RAG_API_KEY


def _search(port: int, query: str) -> tuple[int, list[str]]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = json.dumps({"query": query, "k": 5}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/search",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    try:
        with opener.open(request, timeout=60) as r:
            return r.status, [x["paper_id"] for x in json.loads(r.read())["results"]]
    except urllib.error.HTTPError as e:
        return e.code, []
    except OSError:
        return 0, []


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--base", type=int, default=2000)
    ap.add_argument("--new", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--ingest-after", type=float, default=5.0, help="seconds into the load")
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--procfile",
        action="store_true",
        help="deploy/Procfile under honcho, clients through nginx",
    )
    args = ap.parse_args()

    import subprocess

    from rag import RAG
    from tests.harness import (
        free_port,
        popen_logged,
        start_chroma_server,
        stop_process,
        wait_http_ready,
    )

    base, new = _records(args.base), _records(args.new, skip=args.base)
    result: dict = {
        "base": args.base,
        "new": args.new,
        "clients": args.clients,
        "seconds": args.seconds,
        "through": "nginx (deploy/Procfile under honcho)"
        if args.procfile
        else "the replicas' ports",
    }
    print(f"before: {machine_load()}")
    with tempfile.TemporaryDirectory(
        prefix="rag-deploy-", dir="/work" if Path("/work").is_dir() else None
    ) as tmp:
        root = Path(tmp)
        (root / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
        (root / "new.jsonl").write_text("".join(json.dumps(r) + "\n" for r in new))
        replicas: list[tuple[subprocess.Popen, int]] = []
        deployment: subprocess.Popen | None = None
        server = None
        try:
            if args.procfile:
                ports = {
                    name: free_port()
                    for name in ("CHROMA_PORT", "APP1_PORT", "APP2_PORT", "PROXY_PORT")
                }
                env = {
                    **os.environ,
                    **{k: str(v) for k, v in ports.items()},
                    "RAG_DEPLOY_DIR": str(root),
                    "PATH": (
                        f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
                    ),
                    "PROXY_HOST": "127.0.0.1",
                    "RAG_CHROMA_URL": f"http://127.0.0.1:{ports['CHROMA_PORT']}",
                    "RAG_COLLECTION": "deploy-bench",
                    "RAG_LLM": "none",
                    "RAG_API_KEY": API_KEY,
                }
                (root / "empty.env").write_text("")
                deployment = popen_logged(
                    [
                        "honcho",
                        "start",
                        "-f",
                        str(REPO / "deploy/Procfile"),
                        "-d",
                        str(REPO),
                        "-e",
                        str(root / "empty.env"),
                    ],
                    root / "honcho.log",
                    env,
                    REPO,
                )
                wait_http_ready(
                    deployment,
                    f"{env['RAG_CHROMA_URL']}/api/v2/heartbeat",
                    root / "honcho.log",
                    120,
                )
                chroma_url = env["RAG_CHROMA_URL"]
            else:
                server = start_chroma_server(root / "chroma")
                chroma_url = server.url
                env = {
                    **os.environ,
                    "RAG_CHROMA_URL": chroma_url,
                    "RAG_COLLECTION": "deploy-bench",
                    "RAG_LLM": "none",
                    "RAG_API_KEY": API_KEY,
                }
            start = time.perf_counter()
            RAG(
                store_dir=root / "filler",
                chroma_url=chroma_url,
                collection="deploy-bench",
                llm="none",
            ).ingest([root / "base.jsonl"], include_corpus=False)
            result["base_ingest_s"] = time.perf_counter() - start
            if deployment is not None:
                replicas = [(deployment, ports["APP1_PORT"]), (deployment, ports["APP2_PORT"])]
                for port in (*ports.values(),)[1:]:
                    wait_http_ready(
                        deployment, f"http://127.0.0.1:{port}/healthz", root / "honcho.log", 180
                    )
                targets = [ports["PROXY_PORT"]]
            else:
                for name in ("r1", "r2"):
                    port = free_port()
                    proc = popen_logged(
                        [
                            sys.executable,
                            "-m",
                            "rag",
                            "serve",
                            "--store",
                            str(root / name),
                            "--port",
                            str(port),
                        ],
                        root / f"{name}.log",
                        env,
                        None,
                    )
                    wait_http_ready(
                        proc, f"http://127.0.0.1:{port}/healthz", root / f"{name}.log", 180
                    )
                    replicas.append((proc, port))
                targets = [port for _, port in replicas]
            start = time.perf_counter()
            for _, port in replicas:  # each builds its caches from the server on its first question
                _search(port, base[0]["title"])
            result["replicas_first_question_s"] = time.perf_counter() - start

            latencies: list[float] = []
            errors: list[int] = []
            named: set[str] = set()
            lock = threading.Lock()
            stop = threading.Event()
            ingest_done: list[float] = []
            found_after: dict[int, float] = {}

            def client(i: int) -> None:
                rng = random.Random(i)
                for n in itertools.count():
                    if stop.is_set():
                        return
                    port = targets[(i + n) % len(targets)]
                    t = time.perf_counter()
                    status, ids = _search(port, rng.choice(base)["title"])
                    with lock:
                        latencies.append(time.perf_counter() - t)
                        if status != 200:
                            errors.append(status)
                        named.update(ids)

            def prober(port: int) -> None:
                probe = new[len(new) // 2]
                while not stop.is_set():
                    if ingest_done:
                        status, ids = _search(port, probe["title"])
                        if ids[:1] == [probe.get("id")]:
                            found_after[port] = time.perf_counter() - ingest_done[0]
                            return
                    time.sleep(0.5)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            threads += [threading.Thread(target=prober, args=(port,)) for _, port in replicas]
            load_start = time.perf_counter()
            for t in threads:
                t.start()
            time.sleep(args.ingest_after)
            t0 = time.perf_counter()
            ingest = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rag",
                    "ingest",
                    str(root / "new.jsonl"),
                    "--no-corpus",
                    "--store",
                    str(root / "ingester"),
                ],
                env=env,
                capture_output=True,
                text=True,
            )
            ingest_done.append(time.perf_counter())
            result["new_ingest_s"] = ingest_done[0] - t0
            result["new_ingest_exit"] = ingest.returncode
            while time.perf_counter() - load_start < args.seconds or (
                len(found_after) < 2 and time.perf_counter() - ingest_done[0] < 120
            ):
                time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join()
            # The corpus: every paper the two writing stores hold (ids of records without one are
            # derived).
            known = {
                paper.paper_id
                for name in ("filler", "ingester")
                for paper, _ in RAG(
                    store_dir=root / name,
                    chroma_url=chroma_url,
                    collection="deploy-bench",
                    llm="none",
                ).store.all_papers(abstracts=False)
            }
            strangers = sorted(named - known)
            result.update(
                {
                    "requests": len(latencies),
                    "errors": len(errors),
                    "error_codes": sorted(set(errors)),
                    "p50_ms": percentile(latencies, 50) * 1000,
                    "p95_ms": percentile(latencies, 95) * 1000,
                    "results_naming_unknown_papers": len(strangers),
                    "new_paper_found_after_ingest_s": [
                        round(found_after.get(p, float("nan")), 2) for _, p in replicas
                    ],
                }
            )
        finally:
            for proc, _ in replicas:
                stop_process(proc)
            stop_process(deployment)
            if server is not None:
                server.stop()
    result["load_after"] = machine_load()
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
