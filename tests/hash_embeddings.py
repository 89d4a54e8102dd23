"""An OpenAI-compatible embeddings endpoint on loopback that answers with
`rag.testing.HashEmbedder`'s vectors, for tests that run the real `rag` command in subprocesses and
assert plumbing (crash safety, locking, a full disk), not retrieval quality.

A subprocess cannot be handed `RAG(embedder=HashEmbedder())`; it can be configured, as any user
configures an embeddings service: `RAG_EMBED_MODEL=openai:test-hash` and `RAG_EMBED_BASE_URL`
pointing here (`env`). The product's own endpoint client (`rag/backends/embedders/openai_compat.py`)
then does the embedding calls, and everything around them (chunking, Chroma, the manifest, BM25, the
ingest's pipeline and locks) is the real code.

No model is loaded and nothing is computed worth the name, so an ingest takes no CPU to speak of. A
fault test that must stop an ingest *while it embeds* needs the embedding to take some time, as a
model's does: `pause_per_text` seconds are slept per text of each request (a sleep, so the CPU stays
free for the rest of the run), e.g. 0.02 s: a batch of 64 abstracts (~100 chunks) takes ~2 s, a
question 0.02 s.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from rag.testing import HashEmbedder

MODEL = "test-hash"


class _Handler(BaseHTTPRequestHandler):
    server: HashEmbeddings

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        if not self.path.rstrip("/").endswith("/embeddings"):
            self.send_error(404)
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        texts = request.get("input", [])
        texts = [texts] if isinstance(texts, str) else list(texts)
        self.server.gate(len(texts))
        vectors = self.server.embedder.embed(texts)
        time.sleep(self.server.pause_per_text * len(texts))
        self.server.texts += len(texts)
        # what the openai client asks for by default
        b64 = request.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()
                if b64
                else v,
            }
            for i, v in enumerate(vectors)
        ]
        body = json.dumps(
            {
                "object": "list",
                "data": data,
                "model": request.get("model", MODEL),
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class HashEmbeddings(ThreadingHTTPServer):
    """`with HashEmbeddings(pause_per_text=0.02) as endpoint:` serves on 127.0.0.1 in a thread until
    the block ends; `endpoint.env` configures a `rag` process to embed with it; `texts` counts the
    texts embedded."""

    daemon_threads = True

    def __init__(self, pause_per_text: float = 0.0) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.embedder = HashEmbedder()
        self.pause_per_text = pause_per_text
        self.texts = 0
        self._held = 0  # questions each batch waits for (hold_batches); 0: none
        self._questions = 0  # questions not yet spent on letting a batch through
        self._hold_timeout = 0.0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def hold_batches(self, questions: int, timeout: float = 300.0) -> None:
        """From now on, a request of more than one text (an ingest's batch) is answered only once
        `questions` requests of one text (a question: `rag search` in dense or hybrid mode) have
        arrived since the last batch went through, or after `timeout` seconds: the ingest then lasts
        as long as it takes others to ask that many questions, on a busy machine or an idle one."""
        with self._cond:
            self._held, self._questions, self._hold_timeout = questions, 0, timeout

    def gate(self, texts: int) -> None:
        with self._cond:
            if texts == 1:
                self._questions += 1
                self._cond.notify_all()
            elif self._held:
                self._cond.wait_for(
                    lambda: self._questions >= self._held, timeout=self._hold_timeout
                )
                self._questions = max(self._questions - self._held, 0)

    def handle_error(self, request, client_address) -> None:
        """Quiet about a client gone mid-reply (an ingest the test killed); anything else is
        printed."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    @property
    def env(self) -> dict[str, str]:
        return {"RAG_EMBED_MODEL": f"openai:{MODEL}", "RAG_EMBED_BASE_URL": self.base_url}

    def __enter__(self) -> HashEmbeddings:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
