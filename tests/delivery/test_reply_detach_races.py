"""Replies to a deleted account through races (``timeline.delivery.replies``): a reader
that was no follower while the passes walked (a toggle, a late unfollow) has its copy marked
by its unfollow's purge; lost messages keep the deletion sweeping; a reply to a deleted
account is refused; each copy is marked at most twice; a detached reply reaches new readers
only through reposts, answering nobody."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.delivery.helpers import Recorder, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import TIMING, new_users
from tests.delivery.test_account_deletion import World, rows_holding
from tests.delivery.test_account_deletion_races import only_tombstone
from timeline.delivery.batching.writer import PartitionWriter
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
        gone, replier = await new_users(w.repos, "gone", "replier")
        s = w.service
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        await s.posts.create(replier, replier, "an answer", reply_to=(gone, original.post_id))
        await w.drain()
        await s.accounts.delete(gone, gone)
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


async def test_a_deletion_marks_each_copy_no_more_than_twice(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply's two passes mark each copy once each, one merge request per reader: the
    deletion's later sweeps do not send the message again once its last pass has dropped
    the reply's index row."""
    followers = 20
    async with world_with(own, SLOW_COOLDOWN) as w:
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

        merges = 0
        real = rows.merge_existing

        async def counting(*args: Any, **kwargs: Any) -> bool:
            nonlocal merges
            merges += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(timelines, "merge_existing", counting)
        await s.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)
        assert merges <= 2 * (followers + 1)


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
