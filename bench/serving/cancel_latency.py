"""How long the model keeps generating after a client leaves (issue 31, item 4).

    python -m bench.serving.cancel_latency --store DIR [--rounds 3] [--checkout DIR]

`rag serve` (over a copy of `--store`) answers with a scripted slow model on loopback
(tests/faultproxy.py's ModelStub: 400 words, one per 50 ms, which records when its client closed the
connection). Each round a client asks over each route - `POST /v1/chat/completions` streamed and
not, and the MCP `ask` tool - and hangs up once the model has sent a few words. Printed per route:
the seconds from the client's hang-up to the model connection's close (inf: still open 20 s later)
and the words the model sent. `--checkout DIR` serves another checkout's `rag` package (e.g. `git
archive HEAD` of an older commit) for a before figure.

`--local`: instead, the in-process llama.cpp backend (`rag.backends.chat.LocalChat`, real llama.cpp,
the test model SmolLM2-135M) asked to count to 400, cancelled from another thread after 20 tokens
through `rag.backends.chat.Cancellation` (what `rag serve`, the chat and MCP set when their client
leaves): the seconds until its token loop ended and the tokens it produced after the cancel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from bench.helpers import REPO
from tests.faultproxy import ModelStub
from tests.harness import free_port, popen_logged, stop_process, wait_http_ready

KEY = "bench-key"
QUESTION = "How does Palimpsa relate to Mamba2?"
ROUTES = {
    "http stream": (
        "/v1/chat/completions",
        {"model": "rag", "stream": True, "messages": [{"role": "user", "content": QUESTION}]},
    ),
    "http plain": (
        "/v1/chat/completions",
        {"model": "rag", "messages": [{"role": "user", "content": QUESTION}]},
    ),
    "mcp ask": (
        "/mcp",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "ask", "arguments": {"question": QUESTION}},
        },
    ),
}


def drop(port: int, stub: ModelStub, path: str, payload: dict) -> tuple[float, int]:
    before = len(stub.streams)
    body = json.dumps(payload).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 120
        while (
            len(stub.streams) <= before or stub.streams[before].tokens_sent < 5
        ) and time.monotonic() < deadline:
            time.sleep(0.01)
    left = time.monotonic()
    record = stub.streams[before]
    while record.client_closed is None and time.monotonic() < left + 20:
        time.sleep(0.01)
    took = record.client_closed - left if record.client_closed is not None else float("inf")
    # let the stub finish before the next round
    while record.ended is None and time.monotonic() < left + 30:
        time.sleep(0.05)
    return took, record.tokens_sent


def local_rounds(rounds: int) -> None:
    import threading

    from rag.backends.chat import Cancellation, GenerationCancelled, LocalChat
    from rag.config import Settings
    from tests.harness import find_gguf

    chat = LocalChat(Settings(llm="local", local_model_path=find_gguf(), llm_max_tokens=1500))
    messages = [
        {"role": "user", "content": "Count from 1 to 400, one number per line, and nothing else."}
    ]
    for _ in range(rounds):
        cancellation, tokens, ended = Cancellation(), [], []

        def read(cancellation=cancellation, tokens=tokens, ended=ended) -> None:
            with cancellation.applied():
                try:
                    for _ in chat.stream(messages):
                        tokens.append(time.monotonic())
                except GenerationCancelled:
                    pass
            ended.append(time.monotonic())

        reader = threading.Thread(target=read)
        reader.start()
        while len(tokens) < 20 and reader.is_alive():
            time.sleep(0.005)
        cancelled = time.monotonic()
        cancellation.cancel()
        reader.join()
        after = sum(t > cancelled for t in tokens)
        print(
            f"local llama.cpp: token loop ended {(ended[0] - cancelled) * 1000:.0f} ms after the"
            f" cancel, {after} token(s) after it ({len(tokens)} in all)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--checkout", type=Path, default=REPO)
    ap.add_argument(
        "--local", action="store_true", help="time the in-process llama.cpp backend instead"
    )
    args = ap.parse_args()
    if args.local:
        local_rounds(args.rounds)
        return
    results: dict[str, list[tuple[float, int]]] = {route: [] for route in ROUTES}
    with tempfile.TemporaryDirectory(prefix="cancel-") as tmp, ModelStub() as stub:
        store = Path(tmp) / "store"
        shutil.copytree(args.store, store)
        port = free_port()
        log = Path(tmp) / "serve.log"
        env = {
            **os.environ,
            "RAG_API_KEY": KEY,
            "OPENAI_BASE_URL": stub.base_url,
            "RAG_LLM_MODEL": stub.model,
            "RAG_LLM_CHECK": "false",
        }
        proc = popen_logged(
            [sys.executable, "-m", "rag.cli", "serve", "--store", str(store), "--port", str(port)],
            log,
            env,
            args.checkout,
        )
        try:
            wait_http_ready(proc, f"http://127.0.0.1:{port}/healthz", log, 300)
            for _ in range(args.rounds):
                for route, (path, payload) in ROUTES.items():
                    results[route].append(drop(port, stub, path, payload))
        finally:
            stop_process(proc)
    print(f"checkout: {args.checkout}; model: 400 words, one per 50 ms (20 s in all)")
    for route, rows in results.items():
        figures = ", ".join(
            (f"{t * 1000:.0f} ms" if t != float("inf") else "still open 20 s later")
            + f" ({n} words)"
            for t, n in rows
        )
        print(f"{route:12s} model connection closed after the client left: {figures}")


if __name__ == "__main__":
    main()
