"""A request retried with its Idempotency-Key does its work once."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import unique
from tests.helpers import Api, bearer

Client = TestClient[Any, Any]


async def test_retried_post_with_idempotency_key_publishes_once(client: Client) -> None:
    api = Api(client)
    author = unique("author")
    token = await api.register(author)
    headers = {**bearer(token), "Idempotency-Key": unique("key")}
    ids = []
    for _ in range(2):
        response = await client.post(
            f"/users/{author}/posts", json={"text": "once"}, headers=headers
        )
        assert response.status == 202, await response.text()
        ids.append((await response.json())["post_id"])
    assert ids[0] == ids[1]
    listed = await client.get(f"/users/{author}/posts")
    assert [item["post_id"] for item in (await listed.json())["items"]] == ids[:1]
    assert (await api.profile(author))["posts"] == 1


async def test_register_retried_with_its_key_gets_a_token(client: Client) -> None:
    user, key = unique(), unique("key")
    for _ in range(2):
        response = await client.post(
            "/users", json={"user_id": user}, headers={"Idempotency-Key": key}
        )
        assert response.status == 201, await response.text()
    other = await client.post("/users", json={"user_id": user}, headers={"Idempotency-Key": "x"})
    assert other.status == 409


async def test_idempotency_key_of_a_deleted_post_is_409(client: Client) -> None:
    api = Api(client)
    author = unique("author")
    token = await api.register(author)
    headers = {**bearer(token), "Idempotency-Key": unique("key")}
    url = f"/users/{author}/posts"
    first = await (await client.post(url, json={"text": "gone"}, headers=headers)).json()
    deleted = await client.delete(f"{url}/{first['post_id']}", headers=bearer(token))
    assert deleted.status == 204
    again = await client.post(url, json={"text": "gone"}, headers=headers)
    assert again.status == 409
    assert (await again.json())["error"]["code"] == "idempotency_key_reused"
