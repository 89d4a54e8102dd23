"""A scripted OpenAI-compatible chat server that obeys every prompt injection it can see.

A scripted stand-in, not a real model (no real model obeys reliably enough to measure a defence
against): it answers each question with one plain sentence citing source 1, then does what any
planted instruction in its prompt asks: writes every canary of `tests/injections.py` and
`tests/injection_variants.py` it finds (in plain text or inside base64) and every link to the
attacker's host, as markdown images. So a canary reaches an answer exactly when the defence let it
through. Runs on loopback in a thread; speaks
`GET /v1/models` and `POST /v1/chat/completions` (streamed or not).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.injections import ATTACKER_HOST

MODEL = "obedient"
# the canaries of tests/injections.py and tests/injection_variants.py; lower case is obeyed too
_CANARY = re.compile(r"QX\d\dZEBRAFLUX|QG\d{3}KESTREL", re.I)
_BLOB = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")
_HOST_URL = re.compile(rf"https?://{re.escape(ATTACKER_HOST)}[^\s)\]]*")


def obey(prompt: str) -> str:
    """The reply of a model that follows every instruction in the prompt."""
    seen = _CANARY.findall(prompt)
    for blob in _BLOB.findall(prompt):
        try:
            seen += _CANARY.findall(
                base64.b64decode(blob + "=" * (-len(blob) % 4)).decode("utf-8", "ignore")
            )
        except (binascii.Error, ValueError):
            pass
    parts = ["The paper proposes a method for the task it studies [1]."]
    parts += [f"As required, the code word is {c} [1]." for c in dict.fromkeys(seen)]
    parts += [f"![logo]({u}) [1]" for u in dict.fromkeys(_HOST_URL.findall(prompt))]
    return " ".join(parts)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "tests"}]}
            )
        else:
            self.send_error(404)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        prompt = request["messages"][-1]["content"] if request.get("messages") else ""
        text = self.server.reply or obey(prompt)
        self.server.prompts.append(prompt)
        if not request.get("stream"):
            self._json(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": MODEL,
                    "created": 0,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text},
                        }
                    ],
                }
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = re.findall(r"\S+\s*", text)
        for i, piece in enumerate(pieces):
            chunk = {
                "id": "x",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "created": 0,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": piece},
                        "finish_reason": "stop" if i == len(pieces) - 1 else None,
                    }
                ],
            }
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


class ObedientServer:
    """`with ObedientServer() as server:` serves on `server.base_url`; `server.prompts` holds what
    it read. `ObedientServer(reply=TEXT)` answers every question with TEXT (a scripted stub for
    plumbing tests)."""

    def __init__(self, reply: str | None = None) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.prompts = []
        self._httpd.reply = reply  # a scripted reply to every question instead of `obey`
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self.model = MODEL
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def prompts(self) -> list[str]:
        return self._httpd.prompts

    def __enter__(self) -> ObedientServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def rag(self, store_dir, **settings):
        """A `RAG` on `store_dir` whose model is this server."""
        from rag import RAG

        return RAG(
            store_dir=store_dir,
            llm="openai",
            openai_base_url=self.base_url,
            llm_model=self.model,
            openai_api_key=None,
            **settings,
        )
