"""Lists through the API, with the session's worker: private to their owner, members followed
or not, their posts delivered and backfilled, removed members purged, exclusive lists kept
out of home, deleted lists gone, and every bad input a clear error."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from api import schemas
from fanout_worker.worker import Worker
from tests.conftest import eventually, unique
from tests.delivery.helpers import timeline_ids
from tests.helpers import Api, bearer, body_of, error_of
from timeline.model.keys import list_reader
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


@pytest.fixture
def api(client: Client) -> Api:
    return Api(client)


async def _users(api: Api, *prefixes: str) -> list[tuple[str, str]]:
    return [(name, await api.register(name)) for name in map(unique, prefixes)]


async def _new_list(
    client: Client, owner: str, token: str, title: str = "friends", **body: Any
) -> dict[str, Any]:
    response = await client.post(
        f"/users/{owner}/lists", json={"title": title, **body}, headers=bearer(token)
    )
    assert response.status == 201, await response.text()
    made: dict[str, Any] = await body_of(response, schemas.ListOut)
    assert response.headers["Location"] == f"/users/{owner}/lists/{made['list_id']}"
    return made


async def _member(client: Client, owner: str, token: str, list_id: str, member: str) -> int:
    path = f"/users/{owner}/lists/{list_id}/members/{member}"
    return (await client.put(path, headers=bearer(token))).status


async def _list_ids(client: Client, owner: str, token: str, list_id: str) -> list[str]:
    path = f"/users/{owner}/lists/{list_id}/timeline"
    page = await body_of(await client.get(path, headers=bearer(token)), schemas.PostPage)
    return [item["post_id"] for item in page["items"]]


async def test_a_members_posts_reach_the_list_followed_or_not(
    api: Api, client: Client, worker: Worker
) -> None:
    (owner, to), (followed, tf), (stranger, ts) = await _users(api, "owner", "followed", "other")
    await api.follow(owner, to, followed)
    old = await api.post(stranger, ts, "before the add")
    made = await _new_list(client, owner, to)
    list_id = made["list_id"]
    assert made == {"list_id": list_id, "title": "friends", "exclusive": False}
    for member in (followed, stranger):
        assert await _member(client, owner, to, list_id, member) == 204
    assert await _member(client, owner, to, list_id, stranger) == 204  # idempotent
    new = [await api.post(followed, tf, "in the list"), await api.post(stranger, ts, "me too")]
    wanted = [new[1]["post_id"], new[0]["post_id"], old["post_id"]]

    async def delivered() -> bool:
        return await _list_ids(client, owner, to, list_id) == wanted

    await eventually(delivered, what="the members' posts, the backfilled one too, in the list")
    home = await api.timeline_ids(owner, to)
    assert new[0]["post_id"] in home
    assert new[1]["post_id"] not in home  # not followed
    members = await body_of(
        await client.get(f"/users/{owner}/lists/{list_id}/members", headers=bearer(to)),
        schemas.EdgePage,
    )
    assert sorted(item["user_id"] for item in members["items"]) == sorted([followed, stranger])
    assert (await api.profile(stranger))["followers"] == 0  # a list is no follower
    followers = await client.get(f"/users/{stranger}/followers")
    assert (await body_of(followers, schemas.EdgePage))["items"] == []


async def test_a_removed_member_leaves_the_list(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    (owner, to), (member, tm) = await _users(api, "owner", "member")
    list_id = (await _new_list(client, owner, to))["list_id"]
    assert await _member(client, owner, to, list_id, member) == 204
    post = await api.post(member, tm, "soon gone from the list")
    reader = list_reader(owner, list_id)

    async def landed() -> bool:
        return post["post_id"] in await timeline_ids(repos, reader)

    await eventually(landed, what="the member's post in the list's partition")
    path = f"/users/{owner}/lists/{list_id}/members/{member}"
    assert (await client.delete(path, headers=bearer(to))).status == 204
    assert (await client.delete(path, headers=bearer(to))).status == 204  # idempotent

    async def purged() -> bool:
        return await timeline_ids(repos, reader) == []

    await eventually(purged, what="the removed member's copies purged")
    assert await _list_ids(client, owner, to, list_id) == []


async def test_an_exclusive_lists_members_stay_out_of_home(
    api: Api, client: Client, worker: Worker
) -> None:
    (owner, to), (member, tm), (friend, tf) = await _users(api, "owner", "member", "friend")
    await api.follow(owner, to, member)
    await api.follow(owner, to, friend)
    list_id = (await _new_list(client, owner, to))["list_id"]
    assert await _member(client, owner, to, list_id, member) == 204
    theirs, kept = await api.post(member, tm, "list only?"), await api.post(friend, tf, "home")

    async def both_home() -> bool:
        ids = await api.timeline_ids(owner, to)
        return theirs["post_id"] in ids and kept["post_id"] in ids

    await eventually(both_home, what="both posts at home while the list is not exclusive")
    path = f"/users/{owner}/lists/{list_id}"
    edited = await client.patch(path, json={"exclusive": True}, headers=bearer(to))
    assert (await body_of(edited, schemas.ListOut))["exclusive"] is True
    assert await api.timeline_ids(owner, to) == [kept["post_id"]]  # at once, copy and all
    assert theirs["post_id"] in await _list_ids(client, owner, to, list_id)
    await client.patch(path, json={"exclusive": False}, headers=bearer(to))
    assert theirs["post_id"] in await api.timeline_ids(owner, to)


async def test_a_deleted_list_is_gone_at_once_and_its_rows_after(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    (owner, to), (member, tm) = await _users(api, "owner", "member")
    list_id = (await _new_list(client, owner, to))["list_id"]
    assert await _member(client, owner, to, list_id, member) == 204
    post = await api.post(member, tm, "in a list about to go")
    reader = list_reader(owner, list_id)

    async def landed() -> bool:
        return post["post_id"] in await timeline_ids(repos, reader)

    await eventually(landed, what="the member's post in the list")
    path = f"/users/{owner}/lists/{list_id}"
    assert (await client.delete(path, headers=bearer(to))).status == 204
    for sub in ("/timeline", "/members"):
        assert await error_of(await client.get(path + sub, headers=bearer(to)), 404) == (
            "list_not_found"
        )
    assert await error_of(await client.delete(path, headers=bearer(to)), 404) == "list_not_found"
    lists = await client.get(f"/users/{owner}/lists", headers=bearer(to))
    assert (await body_of(lists, schemas.ListPage))["items"] == []

    async def removed() -> bool:
        return not await repos.follows.is_following(reader, member) and (
            await timeline_ids(repos, reader) == []
        )

    await eventually(removed, what="the deleted list's membership and timeline removed")
    assert (await repos.follows.following_page(reader, 10, None)).items == []


async def test_lists_are_private_and_bad_input_is_a_clear_error(api: Api, client: Client) -> None:
    (owner, to), (other, tt), (blocked, tb) = await _users(api, "owner", "other", "blocked")
    list_id = (await _new_list(client, owner, to, "mine"))["list_id"]
    base = f"/users/{owner}/lists"
    for path in (
        base,
        f"{base}/{list_id}",
        f"{base}/{list_id}/timeline",
        f"{base}/{list_id}/members",
    ):
        assert await error_of(await client.get(path, headers=bearer(tt)), 404) == "list_not_found"
    assert await _member(client, other, tt, list_id, owner) == 404
    assert await error_of(await client.get(f"{base}/{list_id}/timeline"), 401)
    assert await error_of(await client.get(f"{base}/nothex/timeline", headers=bearer(to)), 400) == (
        "invalid_list_id"
    )
    unknown = f"{base}/{'0' * 19}/timeline"
    assert await error_of(await client.get(unknown, headers=bearer(to)), 404) == "list_not_found"
    for body in ({}, {"title": ""}, {"title": "x" * 101}, {"title": 3}, {"title": "t", "x": 1}):
        response = await client.post(base, json=body, headers=bearer(to))
        assert response.status == 400, body
    member_path = f"{base}/{list_id}/members"
    response = await client.put(f"{member_path}/{unique('nobody')}", headers=bearer(to))
    assert await error_of(response, 404) == "user_not_found"
    response = await client.put(f"{member_path}/{owner}", headers=bearer(to))
    assert await error_of(response, 400) == "self_member"
    response = await client.put(f"{member_path}/bad%20id", headers=bearer(to))
    assert await error_of(response, 400) == "invalid_user_id"
    assert (await client.put(f"/users/{blocked}/blocks/{owner}", headers=bearer(tb))).status == 204
    response = await client.put(f"{member_path}/{blocked}", headers=bearer(to))
    assert await error_of(response, 403) == "blocked"
