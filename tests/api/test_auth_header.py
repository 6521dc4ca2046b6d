"""Hostile bytes in the Authorization header: always a 401 with the JSON error body."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from timeline.errors import AuthenticationError
from timeline.model.tokens import TokenSigner

HOSTILE_VALUES = [
    b"Bearer \xff.1.x",
    b"Bearer \x80\x80",
    b"Bearer a.b.c\xc3",
    b"\xff",
    b"Bearer alic\xe9.1.x",
    b"Bearer \xe9",
]


async def _raw_get(client: TestClient[Any, Any], authorization: bytes) -> tuple[bytes, bytes]:
    """Send the header bytes as they are (aiohttp's client refuses); return status line, body."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(
            b"GET /users/x/timeline HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Authorization: " + authorization + b"\r\n\r\n"
        )
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


@pytest.mark.parametrize("authorization", HOSTILE_VALUES)
async def test_non_ascii_authorization_is_401_json(
    client: TestClient[Any, Any], authorization: bytes
) -> None:
    status_line, body = await _raw_get(client, authorization)
    assert status_line.startswith(b"HTTP/1.1 401 "), status_line
    assert orjson.loads(body)["error"]["code"] == "invalid_token"


@pytest.mark.parametrize(
    "token",
    [
        b"\xff.1.x".decode("utf-8", "surrogateescape"),
        b"\x80\x80".decode("utf-8", "surrogateescape"),
        b"a.b.c\xc3".decode("utf-8", "surrogateescape"),
        "alic\xe9.1.x",
        "alice.\u0661\u0662.x",  # Arabic-Indic digits: isdigit() is true, int() accepts them
        "alice.1.x\n",
        "alice.1." + "A" * 43 + "\x00",
    ],
)
def test_verify_rejects_non_ascii_as_invalid_token(token: str) -> None:
    with pytest.raises(AuthenticationError) as raised:
        TokenSigner(b"k", token_ttl_s=60).verify(token)
    assert raised.value.code == "invalid_token"
