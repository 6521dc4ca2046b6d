"""Idempotency keys are bound to their first request, expire, are stored only as HMACs, and
a registration's replay gives a token only to the client that sent it."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import api_client, eventually, make_settings, unique
from tests.helpers import Api, bearer, body_of, error_of
from timeline.config import Settings
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, USERS

Client = TestClient[Any, Any]
LOOPBACK = "127.0.0.0/8,::1"
"""The test server's peer: a trusted proxy, so ``X-Forwarded-For`` names the client."""


@pytest.fixture
async def behind_proxy(settings: Settings, storage: Storage) -> AsyncIterator[Client]:
    """The app behind a proxy on loopback (``storage``: the session's tables exist)."""
    proxied = make_settings(
        settings.storage_connection_string or "", settings.data_dir, trusted_proxies=LOOPBACK
    )
    async with api_client(proxied) as client:
        yield client


def _from(address: str, key: str) -> dict[str, str]:
    return {"X-Forwarded-For": address, "Idempotency-Key": key}


async def test_registration_replay_from_another_client_gets_no_token(
    behind_proxy: Client,
) -> None:
    user, key = unique(), unique("key")
    first = await behind_proxy.post(
        "/users", json={"user_id": user}, headers=_from("203.0.113.5", key)
    )
    assert first.status == 201, await first.text()
    stranger = await behind_proxy.post(
        "/users", json={"user_id": user}, headers=_from("198.51.100.7", key)
    )
    assert await error_of(stranger, 409) == "user_exists"
    assert "token" not in await stranger.text()
    again = await behind_proxy.post(
        "/users", json={"user_id": user}, headers=_from("203.0.113.5", key)
    )
    assert again.status == 201, await again.text()
    token = (await again.json())["token"]
    timeline = await behind_proxy.get(f"/users/{user}/timeline", headers=bearer(token))
    assert timeline.status == 200, await timeline.text()


async def test_registration_replay_with_another_body_is_refused(client: Client) -> None:
    user, key = unique(), unique("key")
    headers = {"Idempotency-Key": key}
    first = await client.post(
        "/users", json={"user_id": user, "display_name": "Ada"}, headers=headers
    )
    assert first.status == 201, await first.text()
    other = await client.post(
        "/users", json={"user_id": user, "display_name": "Eve"}, headers=headers
    )
    assert await error_of(other, 422) == "idempotency_key_reused"
    assert "token" not in await other.text()


async def test_post_replay_with_another_text_is_refused(client: Client) -> None:
    author, key = unique("author"), unique("key")
    token = (await (await client.post("/users", json={"user_id": author})).json())["token"]
    headers = {**bearer(token), "Idempotency-Key": key}
    url = f"/users/{author}/posts"
    first = await client.post(url, json={"text": "one"}, headers=headers)
    assert first.status == 202, await first.text()
    other = await client.post(url, json={"text": "two"}, headers=headers)
    assert await error_of(other, 422) == "idempotency_key_reused"
    listed = await body_of(await client.get(url))
    assert [item["text"] for item in listed["items"]] == ["one"]


async def test_keys_expire_and_are_free_again(settings: Settings, storage: Storage) -> None:
    short = make_settings(
        settings.storage_connection_string or "", settings.data_dir, idempotency_window_s=1
    )
    author, key = unique("author"), unique("key")
    async with api_client(short) as client:
        registered = await client.post(
            "/users", json={"user_id": author}, headers={"Idempotency-Key": key}
        )
        token = (await registered.json())["token"]
        headers = {**bearer(token), "Idempotency-Key": key}
        url = f"/users/{author}/posts"
        first = await (await client.post(url, json={"text": "x"}, headers=headers)).json()

        async def key_is_free() -> bool:
            again = await client.post(url, json={"text": "x"}, headers=headers)
            assert again.status == 202, await again.text()
            return bool((await again.json())["post_id"] != first["post_id"])

        await eventually(key_is_free, timeout_s=10, what="the key to expire")
        replay = await client.post(
            "/users", json={"user_id": author}, headers={"Idempotency-Key": key}
        )
        assert await error_of(replay, 409) == "user_exists"  # no token after the window


async def test_keys_are_stored_as_hmacs(client: Client, storage: Storage) -> None:
    """No key is stored in the clear, nor as a bare hash. (Key rows end by the worker's sweep
    of ``expiries``: ``tests/tables/test_lifetimes.py``.)"""
    author, key = unique("author"), unique("key")
    token = (
        await (
            await client.post("/users", json={"user_id": author}, headers={"Idempotency-Key": key})
        ).json()
    )["token"]
    posted = await client.post(
        f"/users/{author}/posts",
        json={"text": "x"},
        headers={**bearer(token), "Idempotency-Key": key},
    )
    assert posted.status == 202
    rows = [
        row
        async for row in storage.reader(POSTS, author).query_entities(
            "PartitionKey eq @pk", parameters={"pk": author}
        )
    ]
    profile = await storage.reader(USERS, author).get_entity(author, "profile")
    stored = repr(rows) + repr(dict(profile))
    assert key not in stored
    assert hashlib.sha256(key.encode()).hexdigest() not in stored  # not a bare hash either
    key_rows = [row["RowKey"] for row in rows if row["RowKey"].startswith("~idem-")]
    assert len(key_rows) == 1
    assert (await body_of(await client.get(f"/users/{author}")))["posts"] == 1


async def test_a_post_replay_counts_against_the_posting_limit(
    settings: Settings, storage: Storage
) -> None:
    """docs/api.md: "Every mutating route is rate limited", a replay too: a client looping
    on one is slowed like any other."""
    limited = make_settings(settings.connection_string(), settings.data_dir, posts_per_minute=1)
    async with api_client(limited) as client:
        user = unique()
        token = await Api(client).register(user)
        headers = {**bearer(token), "Idempotency-Key": unique("key")}
        url = f"/users/{user}/posts"
        first = await client.post(url, json={"text": "one"}, headers=headers)
        assert first.status == 202, await first.text()
        for _ in range(3):
            again = await client.post(url, json={"text": "one"}, headers=headers)
            if again.status != 202:
                break
        assert await error_of(again, 429) == "rate_limited"
