"""An unfollow or delete that races an in-flight delivery always wins.

Each test holds a delivery's writes in a writer that never lingers out, lets the unfollow or
delete complete entirely, and only then releases the writes: the worst interleaving, made
deterministic on real storage. The delivery's re-check must undo what it wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime

from tests.conftest import eventually, unique
from tests.delivery.helpers import feed_on
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.feed import Feed
from timeline.delivery.processor import FanoutProcessor
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Followed, PostCreated, PostDeleted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def _author_and_follower(repos: Repositories, posts: int = 1) -> tuple[str, str, list[Post]]:
    author, follower = unique("author"), unique("follower")
    now = datetime.now(UTC)
    for user in (author, follower):
        await repos.users.create(User(user, user, created_at=now))
    await repos.follows.add(follower, author, now)
    base = now_ticks()
    created = [Post(new_post_id(base + i * 10), author, f"#{i}") for i in range(posts)]
    for post in created:
        await repos.posts.add(post)
    return author, follower, created


async def _ids(repos: Repositories, owner: str) -> list[str]:
    return [post.post_id for post in (await repos.timelines.page(owner, 1000, None)).items]


async def _hold_then_release(
    writer: PartitionWriter, work: Awaitable[object], interfere: Awaitable[object]
) -> None:
    """Run ``work`` until its writes are buffered, run ``interfere`` to the end, then let the
    held writes (and any the re-check adds) go out until ``work`` finishes."""
    task = asyncio.ensure_future(work)

    async def buffered() -> bool:
        return writer.buffered > 0

    await eventually(buffered, timeout_s=10, what="the delivery's writes to be buffered")
    await interfere
    while not task.done():
        await writer.flush()
        await asyncio.sleep(0.01)
    await task


async def _unfollow(repos: Repositories, feed: Feed, follower: str, author: str) -> None:
    """What the API and then the worker do for an unfollow, to the end."""
    await repos.follows.remove(follower, author)
    await feed.purge(follower, author)


async def test_delete_beats_in_flight_delivery(storage: Storage, repos: Repositories) -> None:
    author, follower, [post] = await _author_and_follower(repos)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        delivering = FanoutProcessor.on(storage, held)
        deleting = FanoutProcessor.on(storage, prompt)
        await _hold_then_release(
            held,
            delivering.handle(PostCreated(author=author, post_id=post.post_id)),
            deleting.handle(PostDeleted(author=author, post_id=post.post_id)),
        )
    assert await _ids(repos, follower) == []
    assert await _ids(repos, author) == []


async def test_unfollow_beats_in_flight_delivery(storage: Storage, repos: Repositories) -> None:
    author, follower, [post] = await _author_and_follower(repos)

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await _hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(
                PostCreated(author=author, post_id=post.post_id)
            ),
            _unfollow(repos, feed_on(storage, prompt), follower, author),
        )
    assert await _ids(repos, follower) == []
    assert await _ids(repos, author) == [post.post_id]


async def test_unfollow_beats_in_flight_backfill(storage: Storage, repos: Repositories) -> None:
    author, follower, _ = await _author_and_follower(repos, posts=5)

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await _hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(Followed(follower=follower, subject=author)),
            _unfollow(repos, feed_on(storage, prompt), follower, author),
        )
    assert await _ids(repos, follower) == []


async def test_delete_beats_in_flight_backfill(storage: Storage, repos: Repositories) -> None:
    author, follower, posts = await _author_and_follower(repos, posts=3)
    doomed = posts[1]
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await _hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(Followed(follower=follower, subject=author)),
            FanoutProcessor.on(storage, prompt).handle(
                PostDeleted(author=author, post_id=doomed.post_id)
            ),
        )
    assert await _ids(repos, follower) == [posts[2].post_id, posts[0].post_id]
