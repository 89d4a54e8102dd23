"""The chat's login throttle counts per client and per user name (issue 50, item 11): five wrong
passwords from one client on an address no longer lock every other client of it out for a
minute. Real HTTP against the running Gradio app (FakeRAG behind it: no model)."""

from __future__ import annotations

import httpx
import pytest

from rag.ui.security import DEVICE_COOKIE, LoginThrottle
from tests.test_ui_hardening import AUTH, client, serve

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it


def _login(c: httpx.Client, url: str, password: str, user: str = AUTH[0]) -> int:
    return c.post(url + "/login", data={"username": user, "password": password}).status_code


def test_one_clients_wrong_passwords_do_not_lock_out_another():
    """All clients here share 127.0.0.1, as clients behind one proxy do. A browser that logged in
    before keeps its own count (a device cookie); wrong passwords for another user name are
    counted for that name; a client that never logged in is still capped."""
    throttle = LoginThrottle(attempts=3, window=60.0)
    with serve(auth=":".join(AUTH), login_throttle=throttle) as (_, url):
        with client() as owner, client() as attacker, client() as newcomer:
            assert _login(owner, url, AUTH[1]) == 200  # the owner's browser, earlier
            assert owner.cookies.get(DEVICE_COOKIE)
            owner.cookies.delete("access-token")
            owner.cookies.delete("access-token-unsecure")
            codes = [_login(attacker, url, f"wrong{i}") for i in range(8)]
            assert codes[:3] == [400] * 3 and set(codes[3:]) == {429}, codes
            assert _login(owner, url, AUTH[1]) == 200  # before: 429 for a minute
            # another name from the same address: its own count (within the address's cap)
            assert _login(newcomer, url, "wrong", user="bob") == 400
            # the same name from a client that never logged in: the attacker's count holds
            assert _login(newcomer, url, AUTH[1]) == 429
            # a made-up device cookie is no device
            attacker.cookies.set(DEVICE_COOKIE, "made-up")
            assert _login(attacker, url, AUTH[1]) == 429


def test_an_address_trying_many_user_names_is_capped_too():
    throttle = LoginThrottle(attempts=2, window=60.0)
    with serve(auth=":".join(AUTH), login_throttle=throttle) as (_, url), client() as c:
        codes = [_login(c, url, "wrong", user=f"user{i}") for i in range(12)]
    assert codes.count(400) == 8 and codes[8:] == [429] * 4, codes  # 2 x 4 in all
