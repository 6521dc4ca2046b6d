"""Lists through the API, with the session's worker: private to their owner, members followed
or not, their posts delivered and backfilled, removed members purged, exclusive lists kept
out of home, deleted lists gone, and every bad input a clear error."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from api import schemas
from api.app import openapi_document
from fanout_worker.worker import Worker
from tests.conftest import eventually, unique
from tests.delivery.helpers import timeline_ids
from tests.helpers import Api, bearer, body_of, error_of
from timeline.model.keys import list_reader
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


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


async def test_a_followers_page_shows_nothing_of_the_lists_a_user_is_in(client: Client) -> None:
    """A membership is a row in the member's ``subjectFollowers`` partition, keyed by the
    list's reader id ``{owner}~{list_id}``, among the followers. ``followers_page`` drops it
    after the query, so the anonymous followers listing gets a short (here empty) page with a
    continuation where it sits: anyone can tell that the user is in someone's private list,
    and, from the neighbouring follower ids (an attacker can follow with ids it chooses),
    narrow down the owner's id. A page that is empty while followers follow also shows
    "Nobody follows you yet" in the web client (``profile.js`` hides "more" on an empty
    first page)."""
    api = Api(client)
    member = unique("member")
    owner = unique("owner")
    fan = unique("zfan")  # sorts after ``{owner}~{list_id}``
    member_token = await api.register(member)
    owner_token = await api.register(owner)
    fan_token = await api.register(fan)
    await api.follow(fan, fan_token, member)
    response = await client.post(
        f"/users/{owner}/lists", json={"title": "secret"}, headers=bearer(owner_token)
    )
    list_id = (await body_of(response, schemas.ListOut))["list_id"]
    path = f"/users/{owner}/lists/{list_id}/members/{member}"
    assert (await client.put(path, headers=bearer(owner_token))).status == 204
    assert member_token

    first = await body_of(
        await client.get(f"/users/{member}/followers", params={"limit": "1"}), schemas.EdgePage
    )
    assert [item["user_id"] for item in first["items"]] == [fan], (
        f"an anonymous followers page shows a hidden row where the list sits: {first}"
    )


def test_list_routes_are_grouped_as_lists_in_the_docs() -> None:
    """``api.openapi_tags`` has no ``lists`` group: ``tag_of`` files the list timeline under
    "timeline" (the home timeline's group) and every other list route under "accounts";
    nor do ``list_id`` and ``member`` get path examples
    (``test_path_examples_are_real_ids_that_match_their_patterns`` fails)."""
    document = openapi_document(250, 280)
    tags = {
        path: operation["tags"][0]
        for path, operations in document["paths"].items()
        for operation in operations.values()
        if "/lists" in path
    }
    assert tags
    assert set(tags.values()) == {"lists"}, tags
