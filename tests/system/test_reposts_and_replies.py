"""Reposts and replies through the API, the queue and a real worker on a real Azurite:
the routes, their refusals, and what a follower's home timeline shows."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from api import schemas
from tests.conftest import eventually, unique
from tests.helpers import Api, bearer, body_of, error_of

Client = TestClient[Any, Any]
pytestmark = pytest.mark.usefixtures("worker")


@pytest.fixture
def api(client: Client) -> Api:
    return Api(client)


async def _users(api: Api, *prefixes: str) -> list[tuple[str, str]]:
    users = []
    for prefix in prefixes:
        name = unique(prefix)
        users.append((name, await api.register(name)))
    return users


async def test_repost_and_undo_through_the_api(api: Api, client: Client) -> None:
    (author, author_token), (reposter, reposter_token), (reader, reader_token) = await _users(
        api, "author", "reposter", "reader"
    )
    await api.follow(reader, reader_token, reposter)
    post = await api.post(author, author_token, "worth sharing")
    body = {"author": author, "post_id": post["post_id"]}
    response = await client.post(
        f"/users/{reposter}/reposts", json=body, headers=bearer(reposter_token)
    )
    assert response.status == 202, await response.text()
    repost = await body_of(response, schemas.RepostOut)
    assert repost["reposted_by"] == reposter
    assert repost["post_id"] == post["post_id"]

    async def shown() -> bool:
        return bool((await api.timeline(reader, reader_token))["items"])

    await eventually(shown, what="the repost on the reposter's follower's timeline")
    [item] = (await api.timeline(reader, reader_token))["items"]
    assert item == {**post, "reposted_by": reposter}
    for _ in range(2):  # idempotent
        response = await client.delete(
            f"/users/{reposter}/reposts/{post['post_id']}", headers=bearer(reposter_token)
        )
        assert response.status == 204

    async def gone() -> bool:
        return not (await api.timeline(reader, reader_token))["items"]

    await eventually(gone, what="the undone repost to leave the timeline")


async def test_repost_refusals(api: Api, client: Client) -> None:
    [(reposter, token)] = await _users(api, "reposter")
    missing = {"author": reposter, "post_id": "0" * 26}
    response = await client.post(f"/users/{reposter}/reposts", json=missing, headers=bearer(token))
    assert await error_of(response, 404) == "post_not_found"
    response = await client.post(
        f"/users/{reposter}/reposts", json={"author": reposter}, headers=bearer(token)
    )
    assert await error_of(response, 400) == "invalid_body"
    response = await client.put(
        f"/users/{reposter}/following/{reposter}x?reposts=maybe", headers=bearer(token)
    )
    assert await error_of(response, 400) == "invalid_reposts"


async def test_replies_through_the_api(api: Api, client: Client) -> None:
    (target, target_token), (replier, replier_token) = await _users(api, "target", "replier")
    post = await api.post(target, target_token, "question?")
    reply_to = {"author": target, "post_id": post["post_id"]}
    response = await client.post(
        f"/users/{replier}/posts",
        json={"text": "answer", "reply_to": reply_to},
        headers=bearer(replier_token),
    )
    assert response.status == 202, await response.text()
    reply = await body_of(response, schemas.PostOut)
    assert reply["reply_to"] == reply_to
    response = await client.get(f"/users/{target}/posts/{post['post_id']}/replies?limit=5")
    page = await body_of(response, schemas.PostPage)
    assert [item["post_id"] for item in page["items"]] == [reply["post_id"]]
    response = await client.post(
        f"/users/{replier}/posts",
        json={"text": "answer", "reply_to": {"author": target, "post_id": "0" * 26}},
        headers=bearer(replier_token),
    )
    assert await error_of(response, 404) == "reply_target_not_found"
    response = await client.get(f"/users/{target}/posts/{'0' * 26}/replies")
    assert await error_of(response, 404) == "post_not_found"


async def test_a_follow_backfills_the_followees_earlier_repost(api: Api, client: Client) -> None:
    users = await _users(api, "author", "reposter", "watcher", "reader")
    (author, author_token), (reposter, reposter_token) = users[:2]
    (watcher, watcher_token), (reader, reader_token) = users[2:]
    await api.follow(watcher, watcher_token, reposter)
    post = await api.post(author, author_token, "worth finding later")
    body = {"author": author, "post_id": post["post_id"]}
    response = await client.post(
        f"/users/{reposter}/reposts", json=body, headers=bearer(reposter_token)
    )
    assert response.status == 202, await response.text()

    async def delivered() -> bool:
        return bool((await api.timeline(watcher, watcher_token))["items"])

    await eventually(delivered, what="the repost's own delivery, before the follow")
    await api.follow(reader, reader_token, reposter)

    async def backfilled() -> bool:
        return bool((await api.timeline(reader, reader_token))["items"])

    await eventually(backfilled, what="the follow's backfill of the repost")
    [item] = (await api.timeline(reader, reader_token))["items"]
    assert item == {**post, "reposted_by": reposter}
