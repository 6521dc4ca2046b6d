"""The client address (per-address registration limits, idempotent registration replays) comes
from ``X-Forwarded-For`` or ``Forwarded`` only when the socket's peer is a trusted proxy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, make_mocked_request

from api.clients import client_address
from tests.conftest import api_client, make_settings, unique
from tests.helpers import error_of
from timeline.config import Settings
from timeline.storage.accounts import Storage
from timeline.tools.azurite import Azurite

Client = TestClient[Any, Any]
LOOPBACK = "127.0.0.0/8,::1"


Limited = Callable[..., Settings]


@pytest.fixture
async def limited(private_azurite: Azurite, tmp_path: Path) -> Limited:
    """Settings allowing one registration per address per minute, on storage of this test's
    own (the limit's rows are per address, and every test server's peer is loopback)."""
    async with Storage(private_azurite.connection_string) as storage:
        await storage.create_all()

    def settings(**overrides: Any) -> Settings:
        return make_settings(
            private_azurite.connection_string, tmp_path, registrations_per_minute=1, **overrides
        )

    return settings


async def _register(client: Client, headers: dict[str, str]) -> int:
    response = await client.post("/users", json={"user_id": unique()}, headers=headers)
    return response.status


async def test_forwarded_address_is_honoured_only_from_a_trusted_peer(limited: Limited) -> None:
    async with api_client(limited(trusted_proxies=LOOPBACK)) as behind_proxy:
        assert await _register(behind_proxy, {"X-Forwarded-For": "203.0.113.1"}) == 201
        assert await _register(behind_proxy, {"X-Forwarded-For": "203.0.113.2"}) == 201
        spoofed = {"X-Forwarded-For": "198.51.100.9, 203.0.113.1"}  # the client wrote the first
        response = await behind_proxy.post("/users", json={"user_id": unique()}, headers=spoofed)
        assert await error_of(response, 429) == "rate_limited"
    async with api_client(limited()) as direct:  # the peer is no proxy: its header is ignored
        assert await _register(direct, {"X-Forwarded-For": "203.0.113.3"}) == 201
        response = await direct.post(
            "/users", json={"user_id": unique()}, headers={"X-Forwarded-For": "203.0.113.4"}
        )
        assert await error_of(response, 429) == "rate_limited"


async def test_the_forwarded_header_when_configured(limited: Limited) -> None:
    settings = limited(trusted_proxies=LOOPBACK, trusted_proxy_header="Forwarded")
    async with api_client(settings) as behind_proxy:
        first = {"Forwarded": 'for="[2001:db8::7]:4711"'}
        assert await _register(behind_proxy, first) == 201
        assert await _register(behind_proxy, {"Forwarded": "for=192.0.2.60;proto=http"}) == 201
        assert await _register(behind_proxy, {"X-Forwarded-For": "203.0.113.8"}) == 201  # peer's
        response = await behind_proxy.post("/users", json={"user_id": unique()}, headers=first)
        assert await error_of(response, 429) == "rate_limited"


TRUSTED = make_settings("", Path(), trusted_proxies="10.0.0.0/8").trusted_proxies


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        ("192.0.2.1", "203.0.113.5", "192.0.2.1"),  # an untrusted peer's header is ignored
        ("10.0.0.2", "203.0.113.5", "203.0.113.5"),
        ("10.0.0.2", "198.51.100.1, 203.0.113.5", "203.0.113.5"),  # left of the client: forged
        ("10.0.0.2", "203.0.113.5, 10.0.0.9", "203.0.113.5"),  # a chain of trusted proxies
        ("10.0.0.2", "10.0.0.7, 10.0.0.9", "10.0.0.7"),  # every hop trusted: the leftmost
        ("10.0.0.2", "203.0.113.5:8443", "203.0.113.5"),  # a port, as some proxies add
        ("10.0.0.2", "garbage, 10.0.0.9", "10.0.0.9"),  # not an address: the last trusted hop
        ("10.0.0.2", "", "10.0.0.2"),
        ("::ffff:10.0.0.2", "203.0.113.5", "203.0.113.5"),  # a dual-stack socket's IPv4 peer
    ],
)
def test_the_client_is_the_first_untrusted_hop_from_the_right(
    peer: str, forwarded: str, client: str
) -> None:
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    request = make_mocked_request("GET", "/", headers=headers, transport=_Transport(peer))
    assert client_address(request, TRUSTED) == client


class _Transport:
    """What aiohttp reads the peer from."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self._peer, 40000) if name == "peername" else default
