"""Replies to a deleted account through races (``timeline.delivery.replies``): a reader
that was no follower while the passes walked (a toggle, a late unfollow) has its copy marked
by its unfollow's purge; lost messages keep the deletion sweeping; a reply to a deleted
account is refused; each copy is marked at most twice; a detached reply reaches new readers
only through reposts, answering nobody."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest

from tests.delivery.helpers import Recorder, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import (
    HYBRID,
    THRESHOLD,
    TIMING,
    home_pages,
    new_users,
    regrade,
)
from tests.delivery.test_account_deletion import World, rows_holding, world
from tests.delivery.test_account_deletion_races import only_tombstone
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.errors import NotFoundError
from timeline.model.entities import DETACHED
from timeline.model.messages import (
    AccountDeleted,
    FanoutMessage,
    Followed,
    ReplyDetached,
    Unfollowed,
)
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables import rows, timelines
from timeline.tables.repositories import Repositories

SLOW_COOLDOWN = Timing(write_deadline_s=1.0, sweep_delay_s=2.0, follow_cooldown_s=600.0)
"""The test timing, with a follow cool-down no test step outlasts (a toggling pair)."""


@asynccontextmanager
async def world_with(storage: Storage, timing: Timing) -> AsyncIterator[World]:
    recorder = Recorder(storage, forward=False)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=timing, queue=recorder)
        service = unlimited_service(storage, recorder)
        yield World(storage, Repositories.on(storage), service, processor, recorder)


async def a_reply_to_gone(w: World) -> tuple[str, str, str, str]:
    """``replier`` answers a post of ``gone``; ``reader`` follows both and gets the reply.
    Returns the three users and the reply's id."""
    gone, replier, reader = await new_users(w.repos, "gone", "replier", "reader")
    s = w.service
    for followee in (gone, replier):
        await s.follows.follow(reader, reader, followee)
    original = await s.posts.create(gone, gone, "the original")
    await w.drain()
    reply = await s.posts.create(replier, replier, "an answer", reply_to=(gone, original.post_id))
    await w.drain()
    assert reply.post_id in await timeline_ids(w.repos, reader)
    return gone, replier, reader, reply.post_id


async def a_reply_then_the_deletion(w: World) -> tuple[str, str, str, str]:
    """``replier`` answers a post of ``gone``, then ``gone`` is deleted (its messages not
    run yet). Returns both users, the post's id and the reply's."""
    gone, replier = await new_users(w.repos, "gone", "replier")
    s = w.service
    original = await s.posts.create(gone, gone, "the original")
    await w.drain()
    reply = await s.posts.create(replier, replier, "an answer", reply_to=(gone, original.post_id))
    await w.drain()
    await s.accounts.delete(gone, gone)
    return gone, replier, original.post_id, reply.post_id


def of_pair(follower: str, subject: str) -> Callable[[FanoutMessage], bool]:
    def pick(message: FanoutMessage) -> bool:
        return isinstance(message, Followed | Unfollowed) and (
            message.follower,
            message.subject,
        ) == (follower, subject)

    return pick


async def test_a_toggling_followers_copy_is_marked_by_its_purge(own: Storage) -> None:
    """A reader toggles its follow of the replier (the second unfollow's first pass leaves
    the copies: a toggling pair) while the deletion's passes walk the replier's followers,
    which it is not one of; it follows again within the cool-down (the backfill leaves the
    detached reply out), and the unfollows' second passes find it following: their
    ``reconcile`` marks the copy it keeps."""
    async with world_with(own, SLOW_COOLDOWN) as w:
        gone, replier, reader, reply = await a_reply_to_gone(w)
        s = w.service
        held: list[FanoutMessage] = []
        pair = of_pair(reader, replier)

        for step in (s.follows.unfollow, s.follows.follow, s.follows.unfollow):
            await step(reader, reader, replier)
            # each pair message's second pass waits out the cool-down
            held += await w.drain(lambda m: pair(m) and bool(getattr(m, "confirm", False)))
        assert reply in await timeline_ids(w.repos, reader)  # a toggle: kept

        await s.accounts.delete(gone, gone)
        held += await w.drain(pair)
        assert await w.repos.users.deletions() == []  # the deletion has ended: dropped

        await s.follows.follow(reader, reader, replier)  # within the cool-down
        await w.drain()
        w.recorder.sent.extend(held)
        await w.drain()

        assert reply in await timeline_ids(w.repos, reader)
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_late_unfollows_copy_is_marked_by_its_purge(own: Storage) -> None:
    """The same with the default timing and no toggle: a reader unfollows the replier, and
    the ``Unfollowed`` runs late (a backlog), after the reader follows again; the passes ran
    in between (the reader was no follower). The late purge finds the pair followed, and
    ``reconcile`` marks the copy it keeps."""
    async with world_with(own, TIMING) as w:
        gone, replier, reader, reply = await a_reply_to_gone(w)
        s = w.service
        await s.follows.unfollow(reader, reader, replier)
        held = await w.drain(of_pair(reader, replier))  # its Unfollowed waits in a backlog
        await s.accounts.delete(gone, gone)
        held += await w.drain(of_pair(reader, replier))
        assert await w.repos.users.deletions() == []  # the deletion has ended: dropped
        await s.follows.follow(reader, reader, replier)
        w.recorder.sent.extend(held)  # the late Unfollowed after the Followed
        await w.drain()

        assert reply in await timeline_ids(w.repos, reader)
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_deletion_whose_reply_messages_are_lost_keeps_sweeping(own: Storage) -> None:
    """docs/guarantees.md: "A lost message keeps it sweeping": with every ``ReplyDetached``
    lost, three sweeps go by and the deletion is still in progress; the next sweep's message
    ends it."""
    async with world_with(own, TIMING) as w:
        gone, *_ = await a_reply_then_the_deletion(w)
        sweeps = 0

        def hold(message: FanoutMessage) -> bool:
            nonlocal sweeps
            if isinstance(message, AccountDeleted) and message.phase == "lists":
                sweeps += 1
            return isinstance(message, ReplyDetached) or sweeps > 3

        lost = await w.drain(hold)
        assert [m for m in lost if isinstance(m, ReplyDetached)]
        assert await w.repos.users.deletions() == [gone]  # still sweeping
        w.recorder.sent.extend(m for m in lost if isinstance(m, AccountDeleted))
        await w.drain()
        assert await w.repos.users.deletions() == []
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_reply_to_a_deleted_accounts_post_is_refused(own: Storage) -> None:
    """The post is still there (its ``PostDeleted`` is background work), but a reply made
    after the tombstone could land after the deletion's last look for replies: it is refused,
    as for a post that does not exist."""
    async with world_with(own, SLOW_COOLDOWN) as w:
        gone, replier = await new_users(w.repos, "gone", "replier")
        s = w.service
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        await s.accounts.delete(gone, gone)
        assert await w.repos.posts.get(gone, original.post_id) is not None
        with pytest.raises(NotFoundError) as refused:
            await s.posts.create(replier, replier, "late", reply_to=(gone, original.post_id))
        assert refused.value.code == "reply_target_not_found"
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def counting_merges(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-item list counting the timeline merge requests (marks) made from now on."""
    merges = [0]
    real = rows.merge_existing

    async def counting(*args: Any, **kwargs: Any) -> bool:
        merges[0] += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(timelines, "merge_existing", counting)
    return merges


@pytest.mark.parametrize("late_second_pass", [False, True])
async def test_a_deletion_marks_each_copy_no_more_than_twice(
    own: Storage, monkeypatch: pytest.MonkeyPatch, late_second_pass: bool
) -> None:
    """A reply's two passes mark each copy once each, one merge request per reader; the
    deletion's next sweep does not send the message again once its first pass has begun,
    even when its second pass comes after that sweep (``late_second_pass``)."""
    followers = 5
    async with world_with(own, TIMING) as w:
        gone, replier, *fans = await new_users(
            w.repos, "gone", "replier", *(f"fan{i}" for i in range(followers))
        )
        s = w.service
        for fan in fans:
            await s.follows.follow(fan, fan, replier)
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        await s.posts.create(replier, replier, "an answer", reply_to=(gone, original.post_id))
        await w.drain()
        merges = await counting_merges(monkeypatch)
        await s.accounts.delete(gone, gone)

        sweeps = 0

        def second_pass(message: FanoutMessage) -> bool:
            """The second pass waits out the deletion's next sweep."""
            nonlocal sweeps
            if isinstance(message, AccountDeleted) and message.phase == "lists":
                sweeps += 1
            held = isinstance(message, ReplyDetached) and message.confirm
            return late_second_pass and (held or sweeps > 2)

        w.recorder.sent.extend(await w.drain(second_pass))
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)
        assert merges[0] <= 2 * (followers + 1)


async def test_a_reconcile_reads_no_source_of_a_reply_to_a_live_account(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marking in ``reconcile`` costs nothing on a live thread: the subject's posts' rows,
    read already, say whom each reply answers."""
    replies = 20
    async with world(own) as w:
        other, replier, reader = await new_users(w.repos, "other", "replier", "reader")
        s = w.service
        for followee in (other, replier):
            await s.follows.follow(reader, reader, followee)
        original = await s.posts.create(other, other, "a live thread")
        for i in range(replies):
            await s.posts.create(replier, replier, f"r{i}", reply_to=(other, original.post_id))
        await w.drain()
        assert len(await timeline_ids(w.repos, reader)) == replies + 1
        reads = 0
        real_get, real_deleted = w.repos.posts.get, w.repos.users.deleted

        async def counting(real: Any, *args: Any) -> Any:
            nonlocal reads
            reads += 1
            return await real(*args)

        monkeypatch.setattr(w.repos.posts, "get", lambda *a: counting(real_get, *a))
        monkeypatch.setattr(w.repos.users, "deleted", lambda *a: counting(real_deleted, *a))
        async with PartitionWriter(own, TIMELINES, linger_s=0) as writer:
            await Feed(Context(w.repos, writer, timing=TIMING)).reconcile(reader, replier)
        assert reads == 0


async def test_a_detached_reply_reaches_new_readers_only_through_reposts(own: Storage) -> None:
    """docs/api.md: a reply to a deleted account reaches no new reader but its author, save
    through a repost (a repost reaches a reposter's followers whoever a reply answers):
    answering nobody."""
    async with world_with(own, SLOW_COOLDOWN) as w:
        gone, replier, reposter, newcomer = await new_users(
            w.repos, "gone", "replier", "reposter", "newcomer"
        )
        s = w.service
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        answer = await s.posts.create(
            replier, replier, "an answer", reply_to=(gone, original.post_id)
        )
        reply = answer.post_id
        await w.drain()
        await s.accounts.delete(gone, gone)
        await w.drain()
        await s.follows.follow(newcomer, newcomer, replier)
        await w.drain()
        assert reply not in await timeline_ids(w.repos, newcomer)
        await s.reposts.repost(reposter, reposter, replier, reply)
        await s.follows.follow(newcomer, newcomer, reposter)
        await w.drain()
        shown = [
            (post.original, post.reply_author)
            for post in (await w.repos.timelines.page(newcomer, 1000, None)).items
        ]
        assert shown == [(reply, DETACHED)]


async def test_a_merged_reader_no_longer_sees_a_detached_reply(own: Storage) -> None:
    """docs/api.md: a large author's readers, who read its posts when they read, see a reply
    to a deleted account no more (a reply to someone nobody follows), while a copy stays."""
    async with (
        world_with(own, TIMING) as w,
        PartitionWriter(own, TIMELINES, linger_s=0) as writer,
    ):
        processor = FanoutProcessor.on(own, writer, hybrid=HYBRID, timing=TIMING, queue=w.recorder)
        w = replace(w, processor=processor)
        gone, replier, reader, *others = await new_users(
            w.repos, "gone", "replier", "reader", *(f"f{i}" for i in range(THRESHOLD - 1))
        )
        s = w.service
        for followee in (gone, replier):
            await s.follows.follow(reader, reader, followee)
        for other in others:
            await s.follows.follow(other, other, replier)
        await w.drain()
        await regrade(processor, replier, merge=True)
        assert replier in await w.repos.audience.merged_authors(reader)
        original = await s.posts.create(gone, gone, "the original")
        reply = await s.posts.create(
            replier, replier, "an answer", reply_to=(gone, original.post_id)
        )
        await w.drain()
        assert reply.post_id in [p for page in await home_pages(own, reader) for p in page]
        await s.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)
        assert reply.post_id not in [p for page in await home_pages(own, reader) for p in page]
