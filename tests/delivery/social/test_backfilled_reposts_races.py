"""A follow's backfill of reposts under races: interleavings at its storage calls (process
death before its re-check included), the reconcile, the one-page cut, two workers at once,
a flag changed meanwhile, and its cost on a subject with many repost rows."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.conftest import eventually
from tests.delivery.helpers import add_follow, add_posts, remove_follow
from tests.delivery.social.helpers import (
    hold_then_release,
    people,
    shown,
    stored_repost,
    to_the_end,
    unreposted,
)
from tests.helpers import put_copies
from timeline.delivery import feed
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import Continue, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.repost import repost_copy
from timeline.model.entities import Post
from timeline.model.keys import TICKS_PER_SECOND, new_post_id, now_ticks
from timeline.model.messages import (
    FanoutMessage,
    Followed,
    PostDeleted,
    Unfollowed,
)
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import POSTS, TIMELINES
from timeline.tables.repositories import Repositories
from timeline.tables.reposts import REPOST


class Died(Exception):
    """The backfill's process died before its re-check."""


def _dying_feed(storage: Storage, writer: PartitionWriter) -> Feed:
    """A feed whose backfill dies once its copies have landed (its re-check reads the follow
    first: that second read fails)."""
    repos = Repositories.on(storage)
    read = repos.follows.follow_row
    reads = 0

    async def die_the_second_time(follower: str, subject: str) -> Any:
        nonlocal reads
        reads += 1
        if reads > 1:
            raise Died
        return await read(follower, subject)

    repos.follows.follow_row = die_the_second_time  # type: ignore[method-assign]
    return Feed(Context(repos, writer))


async def _until_delayed(worker: FanoutProcessor, message: FanoutMessage) -> FanoutMessage:
    """Run a message's first pass (every lease of it); return its delayed second pass."""
    outcome: Outcome = await worker.handle(message)
    while isinstance(outcome, Continue) and outcome.delay_s == 0:
        outcome = await worker.handle(outcome.message)
    assert isinstance(outcome, Continue), outcome
    return outcome.message


async def test_an_undo_then_a_backfill_dying_before_its_recheck_leaves_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    """The backfill read the repost live; the undo's first pass ran before the copy landed;
    the backfill died before its re-check: the undo's second pass removes the copy."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    message = await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        worker = FanoutProcessor.on(storage, prompt)
        second: list[FanoutMessage] = []

        async def undo() -> None:
            await repos.reposts.remove(subject, post.post_id, message.repost_id)
            second.append(await _until_delayed(worker, unreposted(message)))

        with pytest.raises(Died):
            await hold_then_release(
                held,
                _dying_feed(storage, held).copy_newest(reader, subject, reposts=True),
                undo(),
            )
        assert await shown(repos, reader) == [(post.post_id, subject)]  # landed late
        await to_the_end(worker, second[0])
    assert await shown(repos, reader) == []


async def test_an_originals_delete_then_a_backfill_dying_before_its_recheck_leaves_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        worker = FanoutProcessor.on(storage, prompt)
        second: list[FanoutMessage] = []

        async def delete() -> None:
            await repos.posts.delete(author, post.post_id)
            message = PostDeleted(author=author, post_id=post.post_id)
            second.append(await _until_delayed(worker, message))

        with pytest.raises(Died):
            await hold_then_release(
                held,
                _dying_feed(storage, held).copy_newest(reader, subject, reposts=True),
                delete(),
            )
        assert await shown(repos, reader) == [(post.post_id, subject)]
        await to_the_end(worker, second[0])
    assert await shown(repos, reader) == []


async def test_an_undo_between_an_unfollow_and_a_refollow_meets_a_dying_backfill(
    storage: Storage, repos: Repositories
) -> None:
    """The reader unfollows and follows again while the undo's passes both run (they skip
    it: not a follower at its second pass); the backfill of its first follow read the
    repost live and its copy lands late, then it dies. The unfollow's second pass finds the
    pair followed again and reconciles: the copy goes."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    [own] = await add_posts(repos, subject, 1)
    message = await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        worker = FanoutProcessor.on(storage, prompt)
        unfollow_second: list[FanoutMessage] = []

        async def interfere() -> None:
            await remove_follow(repos, reader, subject)
            unfollow = Unfollowed(follower=reader, subject=subject)
            unfollow_second.append(await _until_delayed(worker, unfollow))
            await repos.reposts.remove(subject, post.post_id, message.repost_id)
            await to_the_end(worker, unreposted(message))  # both passes: the reader is not in
            await add_follow(repos, reader, subject)
            await to_the_end(worker, Followed(follower=reader, subject=subject))

        with pytest.raises(Died):
            await hold_then_release(
                held,
                _dying_feed(storage, held).copy_newest(reader, subject, reposts=True),
                interfere(),
            )
        assert (post.post_id, subject) in await shown(repos, reader)  # the late copy
        await to_the_end(worker, unfollow_second[0])
    assert await shown(repos, reader) == [(own.post_id, None)]


async def test_a_reconcile_keeps_every_copy_that_must_stay(
    storage: Storage, repos: Repositories
) -> None:
    """A reconcile of (reader, subject) removes only the subject's undone repost: it keeps
    the subject's live repost of another's post, its live self-repost, its posts, another
    followee's repost of the subject's post and of the post the subject reposted."""
    author, subject, other, reader = await people(repos, "author", "subject", "other", "reader")
    undone, kept = await add_posts(repos, author, 2)
    [own] = await add_posts(repos, subject, 1)
    gone = await stored_repost(repos, subject, author, undone.post_id)
    live = await stored_repost(repos, subject, author, kept.post_id)
    self_repost = await stored_repost(repos, subject, subject, own.post_id)
    others = [
        await stored_repost(repos, other, subject, own.post_id),
        await stored_repost(repos, other, author, kept.post_id),
    ]
    for followee in (subject, other, author):
        await add_follow(repos, reader, followee)
    originals = {undone.post_id: undone, kept.post_id: kept, own.post_id: own}
    copies = [repost_copy(originals[m.post_id], m) for m in (gone, live, self_repost, *others)]
    await put_copies(storage, reader, [undone, kept, own, *copies])
    before = await shown(repos, reader)
    assert len(before) == 8, before
    await repos.reposts.remove(subject, undone.post_id, gone.repost_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await Feed(Context(repos, writer)).reconcile(reader, subject)
    after = await shown(repos, reader)
    assert set(before) - set(after) == {(undone.post_id, subject)}, (before, after)


async def test_two_backfills_at_once_with_an_undo_between_leave_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    """Two workers run the same follow; the repost is undone while both hold their copies
    (no undo pass yet): each re-check removes it, whatever the order of their writes."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    first, second = await add_posts(repos, author, 2)
    gone = await stored_repost(repos, subject, author, first.post_id)
    await stored_repost(repos, subject, author, second.post_id)
    await add_follow(repos, reader, subject)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as one,
        PartitionWriter(storage, TIMELINES, linger_s=3600) as two,
    ):
        works = [
            asyncio.ensure_future(
                Feed(Context(Repositories.on(storage), w)).copy_newest(
                    reader, subject, reposts=True
                )
            )
            for w in (one, two)
        ]

        async def both_buffered() -> bool:
            return one.buffered > 0 and two.buffered > 0

        await eventually(both_buffered, timeout_s=10, what="both backfills' writes")
        await repos.reposts.remove(subject, first.post_id, gone.repost_id)
        while not all(work.done() for work in works):
            await one.flush()
            await two.flush()
            await asyncio.sleep(0.01)
        await asyncio.gather(*works)
    assert await shown(repos, reader) == [(second.post_id, subject)]


async def test_reposts_false_set_while_a_backfill_runs_keeps_no_repost_copy(
    storage: Storage, repos: Repositories
) -> None:
    """The follower hides the subject's reposts right after following, while the backfill
    holds its copies: the backfill's re-check reads the flag with the follow and takes its
    repost copies back (else up to 250 old reposts would stay for good)."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    posts = await add_posts(repos, author, 3)
    for post in posts:
        await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)

    async def hide() -> None:
        assert await repos.follows.set_reposts(reader, subject, False)

    async with PartitionWriter(storage, TIMELINES, linger_s=3600) as held:
        task = asyncio.ensure_future(
            Feed(Context(repos, held)).copy_newest(reader, subject, reposts=True)
        )

        async def buffered() -> bool:
            return held.buffered > 0

        await eventually(buffered, timeout_s=10, what="the backfill's writes")
        await hide()
        while not task.done():
            await held.flush()
            await asyncio.sleep(0.01)
        await task
    assert await shown(repos, reader) == []


async def test_the_one_page_cut_leaves_no_gap_where_replies_were_left_out(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cut counts the subject's posts before the reply rule leaves some out: a repost
    older than a post the backfill did not copy (``middle``) never gets in, so the
    backfilled page has no gap."""
    monkeypatch.setattr(feed, "BACKFILL_POSTS", 3)
    author, subject, stranger, reader = await people(
        repos, "author", "subject", "stranger", "reader"
    )
    [old] = await add_posts(repos, author, 1)
    [target] = await add_posts(repos, stranger, 1)
    await stored_repost(repos, subject, author, old.post_id)  # the oldest entry
    middle, _newest = await add_posts(repos, subject, 2)
    base = now_ticks()
    for i in range(2):  # replies to someone the reader does not follow
        reply = Post(
            new_post_id(base + 10 * i),
            subject,
            f"reply {i}",
            reply_author=stranger,
            reply_post=target.post_id,
        )
        await repos.posts.add(reply)
    await add_follow(repos, reader, subject)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await Feed(Context(repos, writer)).copy_newest(reader, subject, reposts=True)
    got = await shown(repos, reader)
    assert (middle.post_id, None) in got or (old.post_id, subject) not in got, got


REPOST_ROWS = 3000


async def _old_reposts(repos: Repositories, storage: Storage, subject: str) -> None:
    """``REPOST_ROWS`` live reposts of posts made before the backfill's window."""
    [author] = await people(repos, "author")
    old = now_ticks() - (feed.REPOST_BACKFILL_S + 3600) * TICKS_PER_SECOND
    originals = [Post(new_post_id(old + 10 * i), author, f"#{i}") for i in range(REPOST_ROWS)]
    later = now_ticks()
    rows = [
        {
            "PartitionKey": subject,
            "RowKey": f"{REPOST}{post.post_id}",
            "author": author,
            "repost_id": new_post_id(later + 10 * i),
        }
        for i, post in enumerate(originals)
    ]
    for start in range(0, len(rows), 100):
        await submit_batch(
            storage, POSTS, subject, [("upsert", row) for row in rows[start : start + 100]]
        )


async def test_a_subjects_reposts_of_old_posts_cost_a_follow_nothing_more(
    storage: Storage, repos: Repositories
) -> None:
    """The backfill reads only the repost rows of posts from its window: of a subject with
    ``REPOST_ROWS`` reposts of older posts it reads no repost row and no original (unbounded,
    it read all of them, and each original: 515 requests for 3,000 rows)."""
    [heavy, reader] = await people(repos, "heavy", "reader")
    await add_posts(repos, heavy, 1)
    await _old_reposts(repos, storage, heavy)
    await add_follow(repos, reader, heavy)
    read = {"repost rows": 0, "originals": 0}
    query, get = repos.reposts._range, repos.posts.get

    async def counted_query(*args: Any, **kwargs: Any) -> Any:
        page = await query(*args, **kwargs)
        read["repost rows"] += len(page.items)
        return page

    async def counted_get(*args: Any) -> Any:
        read["originals"] += 1
        return await get(*args)

    repos.reposts._range = counted_query  # type: ignore[method-assign]
    repos.posts.get = counted_get  # type: ignore[method-assign,assignment]
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await Feed(Context(repos, writer)).copy_newest(reader, heavy, reposts=True)
    assert read == {"repost rows": 0, "originals": 0}
    assert await shown(repos, reader) != []  # the backfill ran: the post is there


async def test_a_damped_refollow_with_held_copies_of_an_undone_repost(
    storage: Storage, repos: Repositories
) -> None:
    """A damped backfill holds the copy of an undone repost (its undo's passes skipped the
    reader) and the redo of that repost: the redo's copy is written (the subject's own
    entries do not count for the dedupe) and the unfollow's second pass removes the old."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    [post] = await add_posts(repos, author, 1)
    first = await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await to_the_end(worker, Followed(follower=reader, subject=subject))
        await remove_follow(repos, reader, subject)
        await repos.follows.add(reader, subject, datetime.now(UTC))  # no index sync yet
        await repos.follows.sync_index(reader, subject)
        await repos.reposts.remove(subject, post.post_id, first.repost_id)
        again = await stored_repost(repos, subject, author, post.post_id)
        await to_the_end(worker, Followed(follower=reader, subject=subject))
        assert set(await shown(repos, reader)) == {(post.post_id, subject)}
        await to_the_end(worker, Unfollowed(follower=reader, subject=subject, confirm=True))
    page = await repos.timelines.page(reader, 10, None)
    assert [p.post_id for p in page.items] == [again.repost_id]
