"""Bind addresses (`rag ui`, `rag serve`): is one this machine only, is a port on it free."""

from __future__ import annotations

import ipaddress
import socket

from rag.errors import InputError

_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """Whether a bind address is this machine only (the UI and the API warn or refuse on others
    without a login or a key)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_port_free(host: str, port: int) -> None:
    """Raise InputError, naming the fix, when nothing can listen on host:port."""
    try:
        with socket.create_server((host.strip("[]"), port)):
            pass
    except OSError as exc:
        raise InputError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "pass another --port, or stop what is using it"
        ) from None
