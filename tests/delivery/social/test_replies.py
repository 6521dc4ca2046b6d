"""Replies: a reply reaches a follower only if the follower also follows the author replied
to (at delivery, at a follow's backfill, and for a merged author at read time); a post's
replies are listed newest first, paged, without deleted ones."""

from __future__ import annotations

from typing import Any

import pytest

from tests.delivery.helpers import add_follow, add_posts, unlimited_service
from tests.delivery.social.helpers import people
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import NotFoundError
from timeline.model.messages import Followed, PostCreated
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def _ids(repos: Repositories, owner: str) -> list[str]:
    return [post.post_id for post in (await repos.timelines.page(owner, 1000, None)).items]


async def test_a_reply_reaches_only_followers_of_both(
    storage: Storage, repos: Repositories
) -> None:
    target, replier, both, only = await people(repos, "target", "replier", "both", "only")
    await add_follow(repos, both, replier)
    await add_follow(repos, both, target)
    await add_follow(repos, only, replier)
    [original] = await add_posts(repos, target, 1)
    service = unlimited_service(storage)
    reply = await service.posts.create(
        replier, replier, "agreed", reply_to=(target, original.post_id)
    )
    thread = await service.posts.create(
        replier, replier, "and more", reply_to=(replier, reply.post_id)
    )
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await worker.handle(PostCreated(author=replier, post_id=reply.post_id))
        await worker.handle(PostCreated(author=replier, post_id=thread.post_id))
    assert await _ids(repos, both) == [thread.post_id, reply.post_id]
    assert await _ids(repos, only) == [thread.post_id]  # a reply to oneself reaches everyone
    assert await _ids(repos, replier) == [thread.post_id, reply.post_id]
    [entry, _] = (await repos.timelines.page(both, 10, None)).items
    assert entry.to_json()["reply_to"] == {"author": replier, "post_id": reply.post_id}


async def test_a_follows_backfill_leaves_out_replies_to_the_unfollowed(
    storage: Storage, repos: Repositories
) -> None:
    target, replier, reader = await people(repos, "target", "replier", "reader")
    [original] = await add_posts(repos, target, 1)
    service = unlimited_service(storage)
    reply = await service.posts.create(replier, replier, "re", reply_to=(target, original.post_id))
    [plain] = await add_posts(repos, replier, 1)
    await add_follow(repos, reader, replier)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await FanoutProcessor.on(storage, writer).handle(Followed(follower=reader, subject=replier))
    assert await _ids(repos, reader) == [plain.post_id]
    assert reply.post_id not in await _ids(repos, reader)


async def test_a_merged_authors_replies_obey_the_rule_at_read_time(
    storage: Storage, repos: Repositories
) -> None:
    target, large, reader = await people(repos, "target", "large", "reader")
    await add_follow(repos, reader, large)
    [original] = await add_posts(repos, target, 1)
    service = unlimited_service(storage)
    reply = await service.posts.create(large, large, "re", reply_to=(target, original.post_id))
    [plain] = await add_posts(repos, large, 1)
    assert await repos.audience.add_merge(reader, large, 20)  # the reader merges it at read time
    home = HomeTimeline(storage, max_merged=20)
    rows, _ = await home.rows(reader, 50, Position())
    assert [row["RowKey"] for row in rows] == [plain.row_key]
    await add_follow(repos, reader, target)
    rows, _ = await home.rows(reader, 50, Position())
    assert [row["RowKey"] for row in rows] == [plain.row_key, reply.row_key]


async def test_a_dormant_readers_page_shows_its_own_replies(
    storage: Storage, repos: Repositories
) -> None:
    """A dormant reader's page merges its own posts from ``posts``: its replies to authors
    it does not follow are its own posts, shown as the delivery shows them (found by the
    chaos test: they vanished from a dormant reader's home timeline)."""
    target, reader = await people(repos, "target", "reader")
    [original] = await add_posts(repos, target, 1)
    service = unlimited_service(storage)
    reply = await service.posts.create(reader, reader, "re", reply_to=(target, original.post_id))
    home = HomeTimeline(storage, max_merged=20)
    rows, _ = await home.rows(reader, 50, Position(dormant=True))
    assert [row["RowKey"] for row in rows] == [reply.row_key]


async def test_replies_are_listed_newest_first_paged_without_deleted_ones(
    storage: Storage, repos: Repositories
) -> None:
    target, first, second = await people(repos, "target", "first", "second")
    [original] = await add_posts(repos, target, 1)
    service = unlimited_service(storage)
    replies = [
        await service.posts.create(who, who, f"#{i}", reply_to=(target, original.post_id))
        for i, who in enumerate([first, second, first, second])
    ]
    await service.posts.delete(second, second, replies[1].post_id)
    listed: list[dict[str, Any]] = []
    continuation: str | None = None
    pages = 0
    while True:
        page = await service.reposts.replies(target, original.post_id, 2, continuation)
        listed.extend(page.items)
        pages += 1
        continuation = page.continuation
        if continuation is None:
            break
    assert [item["post_id"] for item in listed] == [
        replies[3].post_id, replies[2].post_id, replies[0].post_id,
    ]  # fmt: skip
    assert pages >= 2
    assert {item["reply_to"]["post_id"] for item in listed} == {original.post_id}


async def test_a_reply_to_a_missing_post_is_refused(storage: Storage, repos: Repositories) -> None:
    [replier] = await people(repos, "replier")
    service = unlimited_service(storage)
    with pytest.raises(NotFoundError) as refused:
        await service.posts.create(replier, replier, "re", reply_to=(replier, "0" * 26))
    assert refused.value.code == "reply_target_not_found"
