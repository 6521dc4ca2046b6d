"""Blocks and mutes through the API, with the session's real worker, on a real Azurite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

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


async def _shown(api: Api, user: str, token: str) -> list[str]:
    return await api.timeline_ids(user, token)


async def _put(client: Client, path: str, token: str, **body: Any) -> int:
    kwargs: dict[str, Any] = {"json": body} if body else {}
    response = await client.put(path, headers=bearer(token), **kwargs)
    return response.status


async def test_a_block_ends_follows_both_ways_and_purges_both_sides(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    (a, ta), (b, tb) = await _users(api, "blocker", "blocked")
    await api.follow(a, ta, b)
    await api.follow(b, tb, a)
    pa = await api.post(a, ta, "from a")
    pb = await api.post(b, tb, "from b")

    async def both_delivered() -> bool:
        return pb["post_id"] in await timeline_ids(repos, a) and pa["post_id"] in (
            await timeline_ids(repos, b)
        )

    await eventually(both_delivered, what="both posts copied both ways")
    assert await _put(client, f"/users/{a}/blocks/{b}", ta) == 204
    # at once, before any purge: each side's read hides the other's post
    assert pb["post_id"] not in await _shown(api, a, ta)
    assert pa["post_id"] not in await _shown(api, b, tb)
    assert not await repos.follows.is_following(a, b)
    assert not await repos.follows.is_following(b, a)

    async def purged() -> bool:
        return pb["post_id"] not in await timeline_ids(repos, a) and pa["post_id"] not in (
            await timeline_ids(repos, b)
        )

    await eventually(purged, what="the unfollows' purges of both partitions")
    for user, token, other in ((a, ta, b), (b, tb, a)):
        response = await client.put(f"/users/{user}/following/{other}", headers=bearer(token))
        assert await error_of(response, 403) == "blocked"
    assert await _put(client, f"/users/{a}/blocks/{b}", ta) == 204  # idempotent
    listed = await body_of(await client.get(f"/users/{a}/blocks", headers=bearer(ta)))
    assert [item["user_id"] for item in listed["items"]] == [b]
    response = await client.delete(f"/users/{a}/blocks/{b}", headers=bearer(ta))
    assert response.status == 204
    await api.follow(b, tb, a)  # allowed again
    assert (await body_of(await client.get(f"/users/{a}/blocks", headers=bearer(ta))))[
        "items"
    ] == []


async def test_a_mute_hides_at_once_and_an_unmute_restores(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    (reader, tr), (loud, tl), (other, to) = await _users(api, "muter", "loud", "other")
    await api.follow(reader, tr, loud)
    await api.follow(reader, tr, other)
    posts = [await api.post(loud, tl, "loud"), await api.post(other, to, "quiet")]
    wanted = {post["post_id"] for post in posts}

    async def delivered() -> bool:
        return wanted <= set(await timeline_ids(repos, reader))

    await eventually(delivered, what="both posts copied")
    assert await _put(client, f"/users/{reader}/mutes/{loud}", tr) == 204
    assert await _shown(api, reader, tr) == [posts[1]["post_id"]]
    assert await repos.follows.is_following(reader, loud)  # no unfollow
    listed = await body_of(
        await client.get(f"/users/{reader}/mutes", headers=bearer(tr)), schemas.MutePage
    )
    assert listed["items"][0]["user_id"] == loud
    assert listed["items"][0]["expires_at"] is None
    assert listed["items"][0]["reposts"] is True
    response = await client.delete(f"/users/{reader}/mutes/{loud}", headers=bearer(tr))
    assert response.status == 204
    assert set(await _shown(api, reader, tr)) == wanted


async def test_a_mute_stops_applying_at_its_expiry(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    (reader, tr), (loud, tl) = await _users(api, "muter", "loud")
    await api.follow(reader, tr, loud)
    post = await api.post(loud, tl, "loud")

    async def delivered() -> bool:
        return post["post_id"] in await timeline_ids(repos, reader)

    await eventually(delivered, what="the post copied")
    ends = datetime.now(UTC) + timedelta(seconds=2)
    expires = ends.isoformat().replace("+00:00", "Z")
    assert await _put(client, f"/users/{reader}/mutes/{loud}", tr, expires_at=expires) == 204
    shown = await _shown(api, reader, tr)
    if datetime.now(UTC) < ends:  # read before the expiry (a slow machine may miss it)
        assert shown == []

    async def back() -> bool:
        return await _shown(api, reader, tr) == [post["post_id"]]

    await eventually(back, timeout_s=10, what="the post shown again after the expiry")
    assert datetime.now(UTC) >= ends
    mute = await repos.relations.mute_of(reader, loud)
    assert mute is not None
    assert mute.expires_at == pytest.approx(ends.timestamp(), abs=1e-3)


async def test_bad_block_and_mute_requests_are_clear_4xx(api: Api, client: Client) -> None:
    (user, token), (other, _) = await _users(api, "me", "other")
    for kind in ("blocks", "mutes"):
        response = await client.put(f"/users/{user}/{kind}/{user}", headers=bearer(token))
        assert await error_of(response, 400) == f"self_{kind[:-1]}"
        response = await client.put(
            f"/users/{user}/{kind}/{unique('nobody')}", headers=bearer(token)
        )
        assert await error_of(response, 404) == "user_not_found"
        response = await client.put(f"/users/{other}/{kind}/{user}", headers=bearer(token))
        assert await error_of(response, 403) == "forbidden"
        response = await client.get(f"/users/{other}/{kind}", headers=bearer(token))
        assert await error_of(response, 403) == "forbidden"
    path = f"/users/{user}/mutes/{other}"
    for body in (
        {"expires_at": "tomorrow"},
        {"expires_at": "2030-01-01"},  # no time, no offset
        {"expires_at": "2030-01-01T00:00:00"},  # no offset
        {"expires_at": "2001-01-01T00:00:00Z"},  # past
        {"expires_at": "0001-01-01T00:00:00+14:00"},  # before year 1 in UTC
        {"expires_at": "9999-12-31T23:59:59-14:00"},  # too far
    ):
        response = await client.put(path, json=body, headers=bearer(token))
        assert await error_of(response, 400) == "invalid_expiry", body
    response = await client.put(path, json={"reposts": "no"}, headers=bearer(token))
    assert await error_of(response, 400) == "invalid_body"
    response = await client.put(path, json={"reposts": False}, headers=bearer(token))
    assert response.status == 204
