"""The chat page's defences: its Content-Security-Policy, the allow-list of routes, the login and
its throttle.

Every response carries a CSP (`CSPMiddleware`), so nothing remote loads even if markup slipped past
the escaping; only the routes the page and `gradio_client` use are open (`RouteGate`; anything else
is a 404); `RAG_UI_AUTH=user:password` adds a login (`parse_auth`, `make_auth`) with a few attempts
per client and user name per window (`LoginThrottle`). What each allows, and why: docs/ui.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import re
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection

from rag.errors import InputError

from .map_view import MAP_PATH

if TYPE_CHECKING:
    from .map_view import MapPages

log = logging.getLogger(__name__)
LOGIN_FAIL_DELAY = 1.0  # seconds before a wrong password is refused (slows guessing)
# Each relaxation measured in Chromium with Gradio 6.31 (`python -m bench.ui_csp` tries the
# alternatives):
# - script-src 'unsafe-inline' stays. Gradio's page holds 5 inline scripts (its config, API info and
# bootstrap)
#   and re-creates the head bridge (static/map_bridge.js) as a 6th. With all 6 pinned by sha256
#   instead, the
#   chat, its sources panel and the map beside it work, and an injected onerror= no longer runs. But
#   3 of
#   Gradio's scripts hold the URL the page was asked by (127.0.0.1 and localhost give different
#   text), so no
#   hash fixed at launch pins them: that needs each served page hashed in CSPMiddleware.
# - 'unsafe-eval' stays: without it every gr.HTML (the sources panel) shows "Error rendering HTML",
# because
#   Gradio compiles its templates with Function().
# - style-src 'unsafe-inline' stays: Gradio's page has style attributes (as does the map's FRAME),
# and its
#   scripts write <style> elements (the theme, this app's CSS as Gradio rewrites it, icons); without
#   it they
#   are blocked and the page loses its layout. Everything else is as tight as the page allows
#   ('self' for <base>, data: images and fonts for the theme). The /map page gets this header too,
#   under its own stricter policy (its script and style pinned by hash).
CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline' 'unsafe-eval'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "media-src 'none'",
        "worker-src 'none'",
        "frame-src 'self'",  # the map beside the chat (/map)
        "manifest-src 'none'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'self'",  # only the chat may frame its map
    ]
)


async def send_json(
    send, status: int, body: dict, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A small JSON response from ASGI middleware (Gradio's error shape: {"detail": ...})."""
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def send_html(send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class CSPMiddleware:
    """Pure ASGI middleware (safe for streaming responses) adding the CSP and nosniff headers.

    It sits outside the app's routes, so an error a route does not handle becomes a 500 here, with
    the headers; Starlette's own error page would come from outside every middleware, without them.
    """

    def __init__(self, app: Any, policy: str = CSP) -> None:
        self.app, self.policy = app, policy.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def send_with_headers(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() != b"content-security-policy"
                ]
                headers += [
                    (b"content-security-policy", self.policy),
                    (b"x-content-type-options", b"nosniff"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            if started:  # mid-stream: nothing more can be said to this client
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            await send_json(
                send_with_headers, 500, {"detail": "internal error (see the server log)"}
            )


# The cookie that marks a browser that has logged in before (`LoginThrottle.device`).
DEVICE_COOKIE = "rag-login-device"
DEVICE_TTL = 30 * 24 * 3600.0  # seconds a device cookie is honoured
MAX_LOGIN_BODY = 64 * 1024  # bytes of a login form read (a name and a password)


@dataclass
class LoginThrottle:
    """At most `attempts` login attempts per client and user name in any `window` seconds.

    A client is its address, or, for a browser that has logged in here before, the device cookie
    it was given then (OWASP's "device cookies"): many wrong passwords from one address (an
    attacker, or everyone behind one proxy) neither lock out a browser that has logged in before
    nor another user name. A client cannot make up a device (the cookie is a random token this
    process issued), and an address trying many names is capped too (`attempts * 4` in all).
    Attempts are counted when they arrive, so parallel guesses cannot slip past the cap while the
    first ones are still being checked; a successful login clears its count."""

    attempts: int = 5
    window: float = 60.0
    _seen: dict[tuple, deque] = field(default_factory=dict, repr=False)
    _devices: dict[str, tuple[str, float]] = field(default_factory=dict, repr=False)

    def device(self, token: str | None, user: str) -> str | None:
        """The device this cookie names, when this process issued it for this user name."""
        entry = self._devices.get(token or "")
        if entry is None or entry[0] != user or time.monotonic() > entry[1]:
            return None
        return token

    def issue_device(self, user: str) -> str:
        """A new device token for a browser that just logged in as `user`."""
        import secrets

        now = time.monotonic()
        if len(self._devices) > 10_000:
            self._devices = {k: v for k, v in self._devices.items() if v[1] > now}
        token = secrets.token_urlsafe(32)
        self._devices[token] = (user, now + DEVICE_TTL)
        return token

    def keys(self, address: str, user: str, device: str | None) -> list[tuple]:
        """The counts an attempt goes into: its device's alone, else its address and user name's
        and its address's over all names."""
        if device is not None:
            return [("device", device)]
        return [("user", address, user), ("address", address)]

    def acquire(self, client: str | list[tuple]) -> float:
        """0 when this attempt may go ahead (and is counted), else the seconds until one may.
        `client`: an address (all names alike), or the `keys` of an attempt."""
        keys = [("address", client)] if isinstance(client, str) else client
        now = time.monotonic()
        if len(self._seen) > 10_000:  # forget idle clients so the table stays small
            self._seen = {k: q for k, q in self._seen.items() if q and now - q[-1] < self.window}
        waits = []
        for key in keys:
            times = self._seen.setdefault(key, deque())
            while times and now - times[0] >= self.window:
                times.popleft()
            cap = self.attempts * 4 if key[0] == "address" and len(keys) > 1 else self.attempts
            if len(times) >= cap:
                waits.append(self.window - (now - times[0]))
        if waits:
            return max(waits)
        for key in keys:
            self._seen[key].append(now)
        return 0.0

    def succeeded(self, client: str | list[tuple]) -> None:
        keys = [("address", client)] if isinstance(client, str) else client
        for key in keys:
            if key[0] != "address" or len(keys) == 1:
                self._seen.pop(key, None)


# (method, path) pairs the page and gradio_client use, measured in Chromium and with gradio_client:
# GET  /, /assets/*, /static/*, /theme.css, /favicon.ico, /config, /gradio_api/info, .../queue/data,
#      .../heartbeat/<session> (frees a closed tab's state), .../startup-events (launch() calls it)
# POST /login, .../queue/join, .../run/predict (the page's unqueued events, by fn_index)
_OPEN_GET = re.compile(
    r"/(|assets/.+|static/.+|theme\.css|favicon\.ico|robots\.txt|config|logout|"
    r"gradio_api/(info|queue/data|startup-events))"
)
_OPEN_POST = re.compile(r"/(login|gradio_api/queue/join)")
# by name; and the result:
_API_CALL = {
    "POST": re.compile(r"/gradio_api/(?:run|api|call|call/v2)/([^/]+)"),
    "GET": re.compile(r"/gradio_api/call/(?:v2/)?([^/]+)/[^/]+"),
}
_HEARTBEAT = re.compile(r"/gradio_api/heartbeat/[^/]+")
# Gradio's file route, opened only for the files the page offers for download (see `_served_file`).
_FILE = re.compile(r"/gradio_api/file=(/.+)")
SERVED_SUFFIXES = (".bib",)


class RouteGate:
    """Pure ASGI middleware: only the routes the app uses answer; the login is throttled per client.

    Everything else - uploads (the page has no file input: a way to fill the disk), the OpenAPI
    schema, /reset, Gradio's dev and vibe-coding routes - is a 404, as is an API name the app does
    not define (Gradio answers those with a 500). With a login, the heartbeat needs the login too.
    """

    def __init__(
        self, app: Any, throttle: LoginThrottle | None = None, map_pages: MapPages | None = None
    ) -> None:
        self.app, self.throttle, self.map_pages = app, throttle or LoginThrottle(), map_pages

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gradio_app, method = scope["app"], scope["method"]
        path = scope["path"].rstrip("/") or "/"
        if method in ("GET", "HEAD") and (
            _OPEN_GET.fullmatch(path)
            or _HEARTBEAT.fullmatch(path)
            and self._logged_in(scope, gradio_app)
        ):
            return await self.app(scope, receive, send)
        if method in ("GET", "HEAD") and path == MAP_PATH and self.map_pages is not None:
            if not self._logged_in(scope, gradio_app):
                return await send_json(
                    send, 401, {"detail": "Not authenticated: log in on the chat page first"}
                )
            status, body = await asyncio.to_thread(self.map_pages.page)
            return await send_html(send, status, body if method == "GET" else b"")
        served = method in ("GET", "HEAD") and _FILE.fullmatch(path)
        if served and self._served_file(served.group(1), gradio_app):
            return await self.app(scope, receive, send)  # Gradio checks the login itself
        if method == "POST" and path == "/login" and gradio_app.auth is not None:
            return await self._login(scope, receive, send)
        if method == "POST" and _OPEN_POST.fullmatch(path):
            return await self.app(scope, receive, send)
        api = _API_CALL.get(method) and _API_CALL[method].fullmatch(path)
        if api:
            names = {fn.api_name for fn in gradio_app.get_blocks().fns.values()} | {"predict"}
            if api.group(1) in names:
                return await self.app(scope, receive, send)
            return await send_json(send, 404, {"detail": f"no API named {api.group(1)!r}"})
        await send_json(send, 404, {"detail": "Not Found"})

    @staticmethod
    def _served_file(path: str, gradio_app) -> bool:
        """A download the page offers: a .bib file that Gradio copied into its cache (its upload
        directory, which takes no uploads here). Not a URL (Gradio would fetch it), nor anything
        else."""
        if "://" in path or not path.lower().endswith(SERVED_SUFFIXES):
            return False
        try:
            target, cache = Path(path).resolve(), Path(gradio_app.uploaded_file_dir).resolve()
            return target.is_relative_to(cache) and target != cache and target.is_file()
        except (OSError, ValueError, AttributeError):
            return False

    @staticmethod
    def _logged_in(scope, gradio_app) -> bool:
        if gradio_app.auth is None:
            return True
        cookies = HTTPConnection(scope).cookies
        return any(
            cookies.get(f"{name}-{gradio_app.cookie_id}") in gradio_app.tokens
            for name in ("access-token", "access-token-unsecure")
        )

    async def _login(self, scope, receive, send):
        """Throttle a login by client and user name (`LoginThrottle`); a browser that logs in gets
        a device cookie, so that others' wrong passwords never lock it out."""
        from urllib.parse import parse_qs

        body, more = b"", True
        while more and len(body) <= MAX_LOGIN_BODY:
            message = await receive()
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            more = message.get("more_body", False)
        user = (parse_qs(body[:MAX_LOGIN_BODY].decode("utf-8", "replace")).get("username") or [""])[
            0
        ]
        address = (scope.get("client") or ("unknown",))[0]
        device = self.throttle.device(HTTPConnection(scope).cookies.get(DEVICE_COOKIE), user)
        keys = self.throttle.keys(address, user, device)
        wait = self.throttle.acquire(keys)
        if wait:
            seconds = math.ceil(wait)
            return await send_json(
                send,
                429,
                {"detail": f"Too many login attempts; try again in {seconds} s."},
                [(b"retry-after", str(seconds).encode())],
            )
        status = 0
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def watch(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status == 200:
                    token = self.throttle.issue_device(user)
                    cookie = (
                        f"{DEVICE_COOKIE}={token}; Path=/; Max-Age={int(DEVICE_TTL)}; HttpOnly;"
                        " SameSite=Strict"
                    )
                    headers = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, replay, watch)
        if status == 200:
            self.throttle.succeeded(keys)


def parse_auth(value: Any) -> tuple[str, str] | None:
    """`user:password` -> (user, password); None or blank -> no login."""
    if value is None:
        return None
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    value = str(value).strip()
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user.strip() or not password:
        raise InputError("RAG_UI_AUTH must be user:password (both non-empty)")
    return user.strip(), password


def make_auth(pair: tuple[str, str]):
    """Gradio auth callable: constant-time comparison, and a pause before refusing."""
    user, password = pair

    async def check(username: str, given: str) -> bool:
        ok = hmac.compare_digest(username.encode(), user.encode()) & hmac.compare_digest(
            (given or "").encode(), password.encode()
        )
        if not ok:
            await asyncio.sleep(LOGIN_FAIL_DELAY)
        return bool(ok)

    return check


@contextlib.contextmanager
def forwarded_for_trusted_only_when_configured() -> Iterator[None]:
    """uvicorn, under Gradio, takes a loopback client's X-Forwarded-For as its address unless told
    otherwise: anyone on this host could rotate it past the login throttle. While Gradio builds its
    uvicorn config the header is trusted from nobody, unless FORWARDED_ALLOW_IPS names a proxy
    (uvicorn's setting, kept as is)."""
    if "FORWARDED_ALLOW_IPS" in os.environ:
        yield
        return
    os.environ["FORWARDED_ALLOW_IPS"] = ""
    try:
        yield
    finally:
        os.environ.pop("FORWARDED_ALLOW_IPS", None)
