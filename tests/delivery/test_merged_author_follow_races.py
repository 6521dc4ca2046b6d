"""Follows, unfollows and re-follows of a merged author racing its backfill, purge,
deletes and merge rows.

Each interleaving is forced on real storage.
"""

from __future__ import annotations

import asyncio

from tests.delivery.helpers import add_follow, remove_follow
from tests.delivery.hybrid_helpers import (
    HYBRID,
    TIMING,
    add_post,
    home_pages,
    hybrid_processor,
    merge_count,
    move_down_then_check_gone,
    new_users,
    pause_after_first_call,
    regrade,
    run_to_end,
)
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Outcome
from timeline.model.messages import Followed, PostCreated, PostDeleted, Unfollowed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.audience import MERGED
from timeline.tables.repositories import Repositories


async def test_backfill_that_read_copied_copies_merged_era_post_then_delete_skips_it(
    storage: Storage, repos: Repositories
) -> None:
    """A follow's backfill reads the author ``copied`` (outside any write deadline: the mode
    read in ``_merge_for`` comes before ``admission``) and is slow; meanwhile the author is
    moved up (``merged``, since S) and posts P well after S. The backfill then copies the
    newest posts, P among them, into the follower's partition (hidden while merged). P's
    delete takes the ``_never_copied`` shortcut and sweeps only overflow readers, so the
    copy stays; when the author is moved back down, the deleted post shows again."""
    author, fan, *others = await new_users(repos, "large", "fan", "g", "g", "g")
    for user in others:
        await add_follow(repos, user, author)
    await add_follow(repos, fan, author)
    await add_post(repos, author)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = hybrid_processor(storage, writer), hybrid_processor(storage, writer)
        read, resume = asyncio.Event(), asyncio.Event()
        pause_after_first_call(w1._context.repos.audience, "mode", read, resume)
        backfill = asyncio.ensure_future(w1.handle(Followed(follower=fan, subject=author)))
        await asyncio.wait_for(read.wait(), 10)
        await regrade(w2, author, merge=True)
        mode = await repos.audience.mode(author)
        assert mode.state == MERGED
        margin = round(TIMING.sweep_delay_s * 10_000_000)
        post = await add_post(repos, author, mode.since + margin + 10_000)  # made well after
        await run_to_end(w2, PostCreated(author=author, post_id=post.post_id))
        resume.set()
        await backfill
        shown = [p for page in await home_pages(storage, fan) for p in page]
        assert post.post_id in shown
        await run_to_end(w2, PostDeleted(author=author, post_id=post.post_id))
        shown = [p for page in await home_pages(storage, fan) for p in page]
        assert post.post_id not in shown  # hidden: the fan merges the author
        await move_down_then_check_gone(storage, w2, author, others, fan, post.post_id)


async def test_unfollow_refollow_race_turns_overflow_reader_into_merged_with_stale_copies(
    storage: Storage, repos: Repositories
) -> None:
    """An overflow reader R (copies of a merged author L's posts) unfollows L and follows
    it again. The Unfollowed handler reads R's overflow-row etag and sees R not following;
    then R's re-follow is handled (R has room now, so it gets a merge row and no copies);
    then the Unfollowed handler removes the overflow row (its etag is unchanged) and its
    purge, seeing R follow again, only reconciles. R now merges L but keeps copies of L's
    merged-era posts, which no later delete of L sweeps (``_never_copied``): they come back
    when L moves down."""
    author, fan, full1, full2, *others = await new_users(
        repos, "large", "fan", "m", "m", "g", "g", "g"
    )
    for user in [fan, *others]:
        await add_follow(repos, user, author)
    for other_large in (full1, full2):
        await add_follow(repos, fan, other_large)
        assert await repos.audience.add_merge(fan, other_large, HYBRID.max_merged)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = hybrid_processor(storage, writer), hybrid_processor(storage, writer)
        await regrade(w2, author, merge=True)
        mode = await repos.audience.mode(author)
        assert mode.state == MERGED
        assert await repos.audience.copy_etag(author, fan) is not None  # overflow reader
        margin = round(TIMING.sweep_delay_s * 10_000_000)
        post = await add_post(repos, author, mode.since + margin + 10_000)  # made well after
        await run_to_end(w2, PostCreated(author=author, post_id=post.post_id))
        # the fan unfollows one other large author: room for a merge row now
        await remove_follow(repos, fan, full1)
        assert await repos.audience.remove_merge(fan, full1)
        await remove_follow(repos, fan, author)

        follows = w1._context.repos.follows
        real = follows.is_following
        calls = 0

        async def racing_is_following(follower: str, subject: str) -> bool:
            nonlocal calls
            result = await real(follower, subject)
            calls += 1
            if calls == 2:  # inside unmerge_if_unfollowed, after the etags were read
                await add_follow(repos, fan, author)
                await run_to_end(w2, Followed(follower=fan, subject=author))
            return result

        follows.is_following = racing_is_following  # type: ignore[method-assign]
        await run_to_end(w1, Unfollowed(follower=fan, subject=author))
        assert await repos.follows.is_following(fan, author)
        assert author in await repos.audience.merged_authors(fan)
        await run_to_end(w2, PostDeleted(author=author, post_id=post.post_id))
        await move_down_then_check_gone(storage, w2, author, others, fan, post.post_id)


async def test_merge_counter_drifts_below_the_rows_on_unfollow_refollow(
    storage: Storage, repos: Repositories
) -> None:
    """``add_merge`` sees the row present and upserts it without counting; a concurrent
    unfollow handler removes it (and uncounts) in between: the row is back, uncounted. The
    reader can then hold more than ``max_merged`` merge rows."""
    author, reader, extra1, extra2 = await new_users(repos, "large", "reader", "x", "x")
    await add_follow(repos, reader, author)
    assert await repos.audience.add_merge(reader, author, HYBRID.max_merged)
    await repos.audience.change_mode(author, await repos.audience.mode(author), MERGED)
    await remove_follow(repos, reader, author)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w1, w2 = hybrid_processor(storage, writer), hybrid_processor(storage, writer)
        head_read, resume = asyncio.Event(), asyncio.Event()
        pause_after_first_call(w2._context.repos.audience, "_head", head_read, resume)
        follows = w1._context.repos.follows
        real = follows.is_following
        calls = 0
        backfill: asyncio.Future[Outcome] | None = None

        async def racing_is_following(follower: str, subject: str) -> bool:
            nonlocal calls, backfill
            result = await real(follower, subject)
            calls += 1
            if calls == 2:  # inside unmerge_if_unfollowed, after the etags were read
                await add_follow(repos, reader, author)
                backfill = asyncio.ensure_future(
                    w2.handle(Followed(follower=reader, subject=author))
                )
                await asyncio.wait_for(head_read.wait(), 10)
            return result

        follows.is_following = racing_is_following  # type: ignore[method-assign]
        await w1.handle(Unfollowed(follower=reader, subject=author))
        resume.set()
        assert backfill is not None
        await backfill
    assert author in await repos.audience.merged_authors(reader)
    for other in (extra1, extra2):
        await add_follow(repos, reader, other)
        await repos.audience.add_merge(reader, other, HYBRID.max_merged)
    rows = await repos.audience.merged_authors(reader)
    count = await merge_count(storage, reader)
    assert len(rows) <= HYBRID.max_merged, f"{len(rows)} merge rows, counter says {count}"
