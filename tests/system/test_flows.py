"""End-to-end flows through the API, the queue and a real worker on a real Azurite."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from fanout_worker.worker import Worker
from tests.conftest import eventually, messages_done, unique
from tests.helpers import Api, bearer, put_copies
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostCreated, encode
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]
pytestmark = pytest.mark.usefixtures("worker")


@pytest.fixture
def api(client: Client) -> Api:
    return Api(client)


async def _follower_pair(api: Api) -> tuple[str, str, str, str]:
    author, reader = unique("author"), unique("reader")
    author_token = await api.register(author)
    reader_token = await api.register(reader)
    await api.follow(reader, reader_token, author)
    return author, author_token, reader, reader_token


async def test_follower_sees_posts_newest_first(api: Api) -> None:
    author, author_token, reader, reader_token = await _follower_pair(api)
    first = await api.post(author, author_token, "first")
    second = await api.post(author, author_token, "second")

    async def delivered() -> bool:
        sizes = [
            len((await api.timeline(user, token))["items"])
            for user, token in ((reader, reader_token), (author, author_token))
        ]
        return sizes == [2, 2]

    await eventually(delivered, what="both posts on the follower's and the author's timeline")
    page = await api.timeline(reader, reader_token)
    assert page["items"] == [second, first]
    assert page["continuation"] is None
    assert await api.timeline_ids(author, author_token) == [second["post_id"], first["post_id"]]


async def test_non_followers_do_not_get_posts(api: Api) -> None:
    author, author_token, reader, reader_token = await _follower_pair(api)
    stranger = unique("stranger")
    stranger_token = await api.register(stranger)
    post = await api.post(author, author_token, "for followers")

    async def delivered() -> bool:
        return await api.timeline_ids(reader, reader_token) == [post["post_id"]]

    await eventually(delivered, what="delivery to the follower")
    assert await api.timeline_ids(stranger, stranger_token) == []


async def test_600_items_page_as_250_250_100(api: Api, storage: Storage) -> None:
    owner = unique("reader")
    token = await api.register(owner)
    base = now_ticks()
    posts = [Post(new_post_id(base + i * 10), unique("a"), f"#{i}") for i in range(600)]
    await put_copies(storage, owner, posts)

    sizes: list[int] = []
    seen: list[str] = []
    continuation: str | None = None
    while True:
        page = await api.timeline(owner, token, continuation=continuation)
        sizes.append(len(page["items"]))
        seen += [item["post_id"] for item in page["items"]]
        continuation = page["continuation"]
        if continuation is None:
            break
    assert sizes == [250, 250, 100]
    assert seen == [post.post_id for post in reversed(posts)]


async def test_author_posts_page_as_250_250_100(
    api: Api, client: Client, repos: Repositories
) -> None:
    author = unique("author")
    await api.register(author)
    base = now_ticks()
    for i in range(600):
        await repos.posts.add(Post(new_post_id(base + i * 10), author, f"#{i}"))
    sizes: list[int] = []
    seen: set[str] = set()
    continuation: str | None = None
    while True:
        params = {"continuation": continuation} if continuation else {}
        page = await (await client.get(f"/users/{author}/posts", params=params)).json()
        sizes.append(len(page["items"]))
        seen.update(item["post_id"] for item in page["items"])
        continuation = page["continuation"]
        if continuation is None:
            break
    assert sizes == [250, 250, 100]
    assert len(seen) == 600


async def test_follow_backfills_recent_posts(api: Api) -> None:
    author, reader = unique("author"), unique("reader")
    author_token = await api.register(author)
    reader_token = await api.register(reader)
    posted = [(await api.post(author, author_token, f"old {i}"))["post_id"] for i in range(3)]
    await api.follow(reader, reader_token, author)

    async def backfilled() -> bool:
        return await api.timeline_ids(reader, reader_token) == posted[::-1]

    await eventually(backfilled, what="backfill of the author's posts")


async def test_unfollow_purges_only_that_author(api: Api) -> None:
    author, author_token, reader, reader_token = await _follower_pair(api)
    other = unique("other")
    other_token = await api.register(other)
    await api.follow(reader, reader_token, other)
    for i in range(3):
        await api.post(author, author_token, f"from author {i}")
    kept = await api.post(other, other_token, "from other")

    async def both_delivered() -> bool:
        return len(await api.timeline_ids(reader, reader_token)) == 4

    await eventually(both_delivered, what="both deliveries")
    await api.unfollow(reader, reader_token, author)

    async def purged() -> bool:
        return await api.timeline_ids(reader, reader_token) == [kept["post_id"]]

    await eventually(purged, what="purge of the unfollowed author's posts")


async def test_delete_propagates_to_every_timeline(api: Api, client: Client) -> None:
    author, author_token, reader, reader_token = await _follower_pair(api)
    doomed = await api.post(author, author_token, "doomed")
    kept = await api.post(author, author_token, "kept")

    async def delivered() -> bool:
        return len(await api.timeline_ids(reader, reader_token)) == 2

    await eventually(delivered, what="delivery")
    response = await client.delete(
        f"/users/{author}/posts/{doomed['post_id']}", headers=bearer(author_token)
    )
    assert response.status == 204

    async def removed() -> bool:
        return await api.timeline_ids(reader, reader_token) == [kept["post_id"]] and (
            await api.timeline_ids(author, author_token) == [kept["post_id"]]
        )

    await eventually(removed, what="delete propagation")
    assert (await api.profile(author))["posts"] == 1


async def test_redelivered_message_does_not_duplicate(
    api: Api, queue: FanoutQueue, storage: Storage
) -> None:
    author, author_token, reader, reader_token = await _follower_pair(api)
    post = await api.post(author, author_token, "once")
    message = PostCreated(author=author, post_id=post["post_id"])
    async with PartitionWriter(storage, TIMELINES) as writer:
        processor = FanoutProcessor.on(storage, writer)
        await asyncio.gather(processor.handle(message), processor.handle(message))
        await processor.handle(message)
    done = messages_done("post")
    for _ in range(3):
        await queue.send_raw(encode(message))

    async def redelivered() -> bool:
        return messages_done("post") >= done + 3

    await eventually(redelivered, what="three redeliveries done")
    assert await api.timeline_ids(reader, reader_token) == [post["post_id"]]
    assert await api.timeline_ids(author, author_token) == [post["post_id"]]


async def test_malformed_message_is_poisoned_and_worker_keeps_going(
    api: Api, queue: FanoutQueue, worker: Worker
) -> None:
    marker = unique("garbage")
    await queue.send_raw(f"this is not json {marker}")
    await queue.send_raw(f'{{"type": "post", "author": "{marker}", "post_id": "nope"}}')

    async def poisoned() -> bool:
        contents = [message.content for message in await queue.peek_poison()]
        return sum(marker in content for content in contents) == 2

    await eventually(poisoned, what="both malformed messages in fanout-0-poison")
    reasons = [m.reason for m in await queue.peek_poison() if marker in m.content]
    assert all(reason.startswith("malformed") for reason in reasons)

    author, author_token, reader, reader_token = await _follower_pair(api)
    post = await api.post(author, author_token, "still working")

    async def delivered() -> bool:
        return await api.timeline_ids(reader, reader_token) == [post["post_id"]]

    await eventually(delivered, what="delivery after poison")
