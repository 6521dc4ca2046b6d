"""Profile edits, locked accounts and follow requests through the API, with the session's
real worker, and the races of an approval against a withdrawal or refusal, forced."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

import timeline.tables.follows as follows_table
from api import schemas
from fanout_worker.worker import Worker
from tests.conftest import eventually, unique
from tests.delivery.helpers import timeline_ids
from tests.helpers import Api, bearer, body_of, error_of
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


async def _users(api: Api, *prefixes: str) -> list[tuple[str, str]]:
    users = [unique(prefix) for prefix in prefixes]
    return [(user, await api.register(user)) for user in users]


async def _lock(client: Client, user: str, token: str, locked: bool = True) -> dict[str, Any]:
    response = await client.patch(f"/users/{user}", json={"locked": locked}, headers=bearer(token))
    assert response.status == 200, await response.text()
    data: dict[str, Any] = await body_of(response, schemas.Profile)
    return data


async def _follow(client: Client, user: str, token: str, target: str) -> ClientResponse:
    return await client.put(f"/users/{user}/following/{target}", headers=bearer(token))


async def _requests(client: Client, user: str, token: str) -> list[str]:
    response = await client.get(f"/users/{user}/follow_requests", headers=bearer(token))
    page = await body_of(response, schemas.EdgePage)
    return [item["user_id"] for item in page["items"]]


async def test_a_profile_is_edited_by_its_owner_only(api: Api, client: Client) -> None:
    (user, token), (_, other_token) = await _users(api, "me", "other")
    path = f"/users/{user}"
    response = await client.patch(path, json={"display_name": "  Ada L. "}, headers=bearer(token))
    edited = await body_of(response, schemas.Profile)
    assert edited["display_name"] == "Ada L."
    assert edited["locked"] is False
    assert (await _lock(client, user, token))["locked"] is True
    profile = await api.profile(user)
    assert (profile["display_name"], profile["locked"]) == ("Ada L.", True)
    response = await client.patch(path, json={}, headers=bearer(token))
    assert await body_of(response) == profile  # nothing to change
    response = await client.patch(path, json={"locked": False}, headers=bearer(other_token))
    assert await error_of(response, 403) == "forbidden"
    response = await client.patch(path, json={"locked": False})
    assert await error_of(response, 401) == "missing_token"
    for body, code in (
        ({"display_name": "   "}, "invalid_display_name"),
        ({"display_name": "x" * 65}, "invalid_display_name"),
        ({"locked": "yes"}, "invalid_body"),
        ({"colour": "red"}, "invalid_body"),
    ):
        response = await client.patch(path, json=body, headers=bearer(token))
        assert await error_of(response, 400) == code, body
    assert await api.profile(user) == profile  # a refused edit changed nothing


async def test_an_approved_request_starts_the_follow_with_its_backfill(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    (owner, to), (fan, tf) = await _users(api, "owner", "fan")
    earlier = await api.post(owner, to, "before the request")
    await _lock(client, owner, to)
    response = await _follow(client, fan, tf, owner)
    assert response.status == 202
    assert await body_of(response, schemas.FollowRequested) == {"state": "requested"}
    assert (await _follow(client, fan, tf, owner)).status == 202  # asked again: one request
    assert await _requests(client, owner, to) == [fan]
    assert not await repos.follows.is_following(fan, owner)
    assert (await api.profile(owner))["followers"] == 0
    response = await client.put(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204
    assert await repos.follows.is_following(fan, owner)
    assert await _requests(client, owner, to) == []
    profile = await api.profile(owner)
    assert profile["followers"] == 1

    async def backfilled() -> bool:
        return earlier["post_id"] in await timeline_ids(repos, fan)

    await eventually(backfilled, what="the approved follow's backfill")
    assert (await _follow(client, fan, tf, owner)).status == 204  # following already
    response = await client.put(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204  # a resend after a lost answer: done already
    assert (await api.profile(owner))["followers"] == 1


async def test_a_refused_or_withdrawn_request_cannot_be_approved(
    api: Api, client: Client, repos: Repositories
) -> None:
    (owner, to), (fan, tf), (other, tt) = await _users(api, "owner", "fan", "other")
    await _lock(client, owner, to)
    for user, token in ((fan, tf), (other, tt)):
        assert (await _follow(client, user, token, owner)).status == 202
    response = await client.delete(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204  # refused
    response = await client.delete(f"/users/{other}/following/{owner}", headers=bearer(tt))
    assert response.status == 204  # withdrawn
    assert await _requests(client, owner, to) == []
    for user in (fan, other):
        response = await client.put(f"/users/{owner}/follow_requests/{user}", headers=bearer(to))
        assert await error_of(response, 404) == "follow_request_not_found"
        assert not await repos.follows.is_following(user, owner)
    response = await client.delete(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204  # idempotent


async def test_unlocking_accepts_nothing_and_a_new_follow_is_immediate(
    api: Api, client: Client, repos: Repositories
) -> None:
    (owner, to), (fan, tf), (late, tl) = await _users(api, "owner", "fan", "late")
    await _lock(client, owner, to)
    assert (await _follow(client, fan, tf, owner)).status == 202
    await _lock(client, owner, to, locked=False)
    assert await _requests(client, owner, to) == [fan]
    assert not await repos.follows.is_following(fan, owner)
    assert (await _follow(client, late, tl, owner)).status == 204
    assert await repos.follows.is_following(late, owner)
    assert (await _follow(client, fan, tf, owner)).status == 204  # now a plain follow
    response = await client.put(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204  # the request left over is consumed, the follow stays
    assert await _requests(client, owner, to) == []
    assert (await api.profile(owner))["followers"] == 2


async def test_a_block_drops_requests_both_ways_and_refuses_new_ones(
    api: Api, client: Client
) -> None:
    (owner, to), (fan, tf) = await _users(api, "owner", "fan")
    await _lock(client, owner, to)
    assert (await _follow(client, fan, tf, owner)).status == 202
    response = await client.put(f"/users/{owner}/blocks/{fan}", headers=bearer(to))
    assert response.status == 204
    assert await _requests(client, owner, to) == []
    assert await error_of(await _follow(client, fan, tf, owner), 403) == "blocked"


async def test_follow_requests_are_private_and_checked(api: Api, client: Client) -> None:
    (owner, to), (fan, tf) = await _users(api, "owner", "fan")
    for method in ("PUT", "DELETE"):
        response = await client.request(
            method, f"/users/{owner}/follow_requests/{fan}", headers=bearer(tf)
        )
        assert await error_of(response, 403) == "forbidden", method
        response = await client.request(
            method, f"/users/{owner}/follow_requests/{owner}", headers=bearer(to)
        )
        assert await error_of(response, 400) == "self_follow", method
    response = await client.get(f"/users/{owner}/follow_requests", headers=bearer(tf))
    assert await error_of(response, 403) == "forbidden"
    response = await client.put(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert await error_of(response, 404) == "follow_request_not_found"


async def test_an_approval_meets_a_withdrawal_and_its_own_resend(repos: Repositories) -> None:
    """Forced interleavings on the rows: an approval that read the request before it was
    withdrawn creates no follow; one that read it before the follower asked again still
    finds it unchanged; a resend of a committed approval finds the follow made."""
    owner, fan, other = unique("owner"), unique("fan"), unique("other")
    follows = repos.follows
    await follows.request(fan, owner)
    read = await follows.request_of(fan, owner)
    assert read is not None
    await follows.drop_request(fan, owner)  # withdrawn between the read and the approval
    assert not await follows.approve(fan, owner, read)
    assert not await follows.is_following(fan, owner)
    await follows.request(other, owner)
    read = await follows.request_of(other, owner)
    assert read is not None
    await follows.request(other, owner)  # asked again meanwhile: the row is unchanged
    assert await follows.approve(other, owner, read)
    assert not await follows.approve(other, owner, read)  # the resend meets its own commit
    assert await follows.is_following(other, owner)
    assert await follows.follower_count(owner) == 1


async def test_a_refusal_between_the_approvals_two_writes_is_no_error(
    api: Api, client: Client, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follow made while unlocked, with a request left over: the approval meets the follow
    (409) and deletes the request alone; a refusal landing between the two finds it gone."""
    (owner, to), (fan, tf) = await _users(api, "owner", "fan")
    await _lock(client, owner, to)
    assert (await _follow(client, fan, tf, owner)).status == 202
    await _lock(client, owner, to, locked=False)
    assert (await _follow(client, fan, tf, owner)).status == 204
    real = follows_table.transact  # type: ignore[attr-defined]

    async def refused_first(*args: Any) -> None:  # only the 409 path calls this name
        await repos.follows.drop_request(fan, owner)
        await real(*args)

    monkeypatch.setattr(follows_table, "transact", refused_first)
    response = await client.put(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204
    assert await repos.follows.is_following(fan, owner)


async def test_a_requests_reposts_choice_is_the_follows(
    api: Api, client: Client, repos: Repositories
) -> None:
    (owner, to), (fan, tf) = await _users(api, "owner", "fan")
    await _lock(client, owner, to)
    response = await client.put(f"/users/{fan}/following/{owner}?reposts=false", headers=bearer(tf))
    assert response.status == 202
    response = await client.put(f"/users/{owner}/follow_requests/{fan}", headers=bearer(to))
    assert response.status == 204
    page = await repos.follows.repost_follower_ids_page(owner, 10, None, 0.0)
    assert fan not in page.items  # the follower asked not to get the owner's reposts
