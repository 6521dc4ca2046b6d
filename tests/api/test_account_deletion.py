"""Deleting an account through the API: at once its tokens are refused, its profile is a 404
and its id (in any spelling) cannot be registered again; only its owner may delete it."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from api import schemas
from tests.conftest import unique
from tests.helpers import Api, bearer, body_of, error_of

Client = TestClient[Any, Any]


async def test_a_deleted_account_is_gone_at_once_and_its_id_stays_taken(client: Client) -> None:
    api = Api(client)
    user, other = unique("Del"), unique("other")
    token, other_token = await api.register(user), await api.register(other)
    deleted = await client.delete(f"/users/{user}", headers=bearer(token))
    assert deleted.status == 202
    assert await body_of(deleted, schemas.AccountDeleting) == {"user_id": user, "state": "deleting"}
    assert await error_of(await client.get(f"/users/{user}"), 404) == "user_not_found"
    post = await client.post(f"/users/{user}/posts", json={"text": "hi"}, headers=bearer(token))
    assert await error_of(post, 401) == "revoked_token"
    again = await client.delete(f"/users/{user}", headers=bearer(token))
    assert again.status == 401
    for spelling in (user, user.lower(), user.upper()):
        registered = await client.post("/users", json={"user_id": spelling})
        assert await error_of(registered, 409) == "user_exists"
    follow = await client.put(f"/users/{other}/following/{user}", headers=bearer(other_token))
    assert await error_of(follow, 404) == "user_not_found"


async def test_only_the_owner_deletes_an_account(client: Client) -> None:
    api = Api(client)
    user, other = unique("owner"), unique("other")
    await api.register(user)
    other_token = await api.register(other)
    assert await error_of(await client.delete(f"/users/{user}"), 401) == "missing_token"
    answer = await client.delete(f"/users/{user}", headers=bearer(other_token))
    assert await error_of(answer, 403) == "forbidden"
    assert (await api.profile(user))["user_id"] == user
