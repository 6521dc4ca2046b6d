"""A follow's backfill brings the subject's newest live reposts with its posts, under the
live reposts' de-duplication, and leaves no copy whose reason went while it ran."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.delivery.helpers import add_follow, add_posts, feed_on, run_every_pass
from tests.delivery.social.helpers import (
    hold_then_release,
    people,
    shown,
    stored_repost,
    unreposted,
)
from tests.helpers import put_copies
from timeline.delivery import feed
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.model.messages import Followed, PostDeleted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def _backfill(storage: Storage, reader: str, subject: str) -> None:
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await run_every_pass(
            FanoutProcessor.on(storage, writer), Followed(follower=reader, subject=subject)
        )


async def test_a_follow_backfills_the_subjects_reposts_among_its_posts(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader = await people(repos, "author", "subject", "reader")
    old, new = await add_posts(repos, author, 2)
    [first] = await add_posts(repos, subject, 1)
    await stored_repost(repos, subject, author, new.post_id)
    [second] = await add_posts(repos, subject, 1)
    await stored_repost(repos, subject, author, old.post_id)  # an old post, reposted last
    await add_follow(repos, reader, subject)
    await _backfill(storage, reader, subject)
    assert await shown(repos, reader) == [
        (old.post_id, subject),
        (second.post_id, None),
        (new.post_id, subject),
        (first.post_id, None),
    ]
    [repost] = (await repos.timelines.page(reader, 1, None)).items
    assert repost.to_json() == {**old.to_json(), "reposted_by": subject}


async def test_a_backfill_leaves_out_reposts_that_lost_their_reason_or_show_twice(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader, hider = await people(repos, "author", "subject", "reader", "hider")
    undone, deleted, held, kept = await add_posts(repos, author, 4)
    [own] = await add_posts(repos, subject, 1)
    for post in (undone, deleted, held, kept):
        message = await stored_repost(repos, subject, author, post.post_id)
        if post is undone:
            await repos.reposts.remove(subject, post.post_id, message.repost_id)
    await stored_repost(repos, subject, subject, own.post_id)  # a post the backfill copies
    await repos.posts.delete(author, deleted.post_id)  # its delete's passes still to come
    await put_copies(storage, reader, [held])  # among the reader's newest entries
    await add_follow(repos, reader, subject)
    await repos.follows.add(hider, subject, datetime.now(UTC), reposts=False)
    await _backfill(storage, reader, subject)
    await _backfill(storage, hider, subject)
    assert await shown(repos, reader) == [
        (kept.post_id, subject),
        (own.post_id, None),
        (held.post_id, None),
    ]
    assert await shown(repos, hider) == [(own.post_id, None)]


async def test_a_damped_backfill_counts_the_repost_copies_it_holds(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    await _backfill(storage, reader, subject)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await feed_on(storage, writer).copy_newest(reader, subject, missing_only=True, reposts=True)
        assert writer.requests == 0  # nothing missing, nothing written
    assert await shown(repos, reader) == [(post.post_id, subject)]


async def test_an_undo_racing_a_backfill_leaves_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    [own] = await add_posts(repos, subject, 1)
    message = await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)

    async def undo(worker: FanoutProcessor) -> None:
        await repos.reposts.remove(subject, post.post_id, message.repost_id)
        await worker.handle(unreposted(message))  # its first pass only

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(Followed(follower=reader, subject=subject)),
            undo(FanoutProcessor.on(storage, prompt)),
        )
    assert await shown(repos, reader) == [(own.post_id, None)]


async def test_an_originals_delete_racing_a_backfill_leaves_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader = await people(repos, "author", "subject", "reader")
    first, second = await add_posts(repos, author, 2)
    [own] = await add_posts(repos, subject, 1)
    for post in (first, second):
        await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)

    async def delete(worker: FanoutProcessor) -> None:
        await repos.posts.delete(author, first.post_id)  # the API's write, no pass yet
        await repos.posts.delete(author, second.post_id)
        await worker.handle(PostDeleted(author=author, post_id=second.post_id))  # first pass

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(Followed(follower=reader, subject=subject)),
            delete(FanoutProcessor.on(storage, prompt)),
        )
        # the re-check reads the repost the first pass voided; the other's pass comes after
        assert await shown(repos, reader) == [(first.post_id, subject), (own.post_id, None)]
        await FanoutProcessor.on(storage, prompt).handle(
            PostDeleted(author=author, post_id=first.post_id)
        )
    assert await shown(repos, reader) == [(own.post_id, None)]


async def test_an_unfollow_racing_a_backfill_purges_its_repost_copies(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    await add_posts(repos, subject, 1)
    await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)

    async def unfollow(storage: Storage, writer: PartitionWriter) -> None:
        await repos.follows.remove(reader, subject)
        await feed_on(storage, writer).purge(reader, subject)

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(Followed(follower=reader, subject=subject)),
            unfollow(storage, prompt),
        )
    assert await shown(repos, reader) == []


async def test_a_reconcile_removes_the_copy_of_an_undone_repost(
    storage: Storage, repos: Repositories
) -> None:
    """A copy landing late in the timeline of a reader who was between an unfollow and a
    re-follow of the reposter when the undo's passes ran (they skipped it): the unfollow's
    second pass finds the pair followed again and reconciles."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    undone, kept = await add_posts(repos, author, 2)
    gone = await stored_repost(repos, subject, author, undone.post_id)
    await stored_repost(repos, subject, author, kept.post_id)
    await add_follow(repos, reader, subject)
    await _backfill(storage, reader, subject)
    await repos.reposts.remove(subject, undone.post_id, gone.repost_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await feed_on(storage, writer).reconcile(reader, subject)
    assert await shown(repos, reader) == [(kept.post_id, subject)]


async def test_a_backfill_is_one_page_of_posts_and_reposts(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feed, "BACKFILL_POSTS", 3)
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [old] = await add_posts(repos, author, 1)
    posts = await add_posts(repos, subject, 3)
    await stored_repost(repos, subject, author, old.post_id)
    await stored_repost(repos, subject, subject, posts[0].post_id)  # its post cut: shown
    await add_follow(repos, reader, subject)
    await _backfill(storage, reader, subject)
    assert await shown(repos, reader) == [
        (posts[0].post_id, subject),
        (old.post_id, subject),
        (posts[2].post_id, None),
    ]
