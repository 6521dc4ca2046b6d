"""Replies to a deleted account across the deletion's sweeps (``timeline.delivery.replies``):
a reply deleted between its passes, and a pass lost after its first, still let the
deletion end (the second pass drops the index row of a deleted reply); two chains of one
reply at work at once, with a copy from an old read landing between, leave no row naming
the user."""

from __future__ import annotations

from collections.abc import Callable

from tests.delivery.hybrid_helpers import TIMING, new_users
from tests.delivery.test_account_deletion import rows_holding
from tests.delivery.test_account_deletion_races import only_tombstone
from tests.delivery.test_reply_detach import copy_of
from tests.delivery.test_reply_detach_races import a_reply_then_the_deletion, world_with
from timeline.model.entities import DETACHED
from timeline.model.messages import AccountDeleted, FanoutMessage, ReplyDetached
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import TIMELINES

SWEEPS = 4
"""Sweeps of the deletion a test lets run (one that never ends would loop forever)."""


def sweeps_beyond(limit: int) -> Callable[[FanoutMessage], bool]:
    """Holds every message once the deletion has begun more than ``limit`` sweeps."""
    count = [0]

    def beyond(message: FanoutMessage) -> bool:
        if isinstance(message, AccountDeleted) and message.phase == "lists":
            count[0] += 1
        return count[0] > limit

    return beyond


async def test_a_reply_deleted_between_its_passes_ends_the_deletion(
    own: Storage,
) -> None:
    """The first sweep's ``ReplyDetached`` marks the reply and notes its ``~re-`` row;
    before its second pass the replier deletes the reply, whose ``PostDeleted`` (built from
    the marked row) drops no index row: the second pass, finding no reply, drops it."""
    async with world_with(own, TIMING) as w:
        gone, replier, _, reply = await a_reply_then_the_deletion(w)
        s = w.service

        def second_pass(message: FanoutMessage) -> bool:
            return isinstance(message, ReplyDetached) and message.confirm

        # the first sweep and the first pass; the second pass waits (sweep_delay_s)
        first_sweep_done = [False]

        def hold(message: FanoutMessage) -> bool:
            if isinstance(message, AccountDeleted) and message.confirm:
                first_sweep_done[0] = True
                return True  # the next sweep comes later
            return second_pass(message)

        held = await w.drain(hold)
        assert first_sweep_done[0]
        assert [m for m in held if second_pass(m)]
        await s.posts.delete(replier, replier, reply)  # within sweep_delay_s
        await w.drain(lambda m: isinstance(m, AccountDeleted))  # its PostDeleted
        w.recorder.sent.extend(held)
        await w.drain(sweeps_beyond(SWEEPS))
        left = await rows_holding(own, gone)
        assert await w.repos.users.deletions() == [], f"the deletion never ends: {left}"
        assert left == only_tombstone(gone)


async def test_a_second_pass_lost_after_the_note_is_sent_again(
    own: Storage,
) -> None:
    """The reply's second pass is lost (poisoned, then dropped) after its first pass noted
    the ``~re-`` row: the sweep after next sends the reply again, and the deletion ends."""
    async with world_with(own, TIMING) as w:
        await a_reply_then_the_deletion(w)
        beyond = sweeps_beyond(SWEEPS)

        dropped: list[FanoutMessage] = []

        def lost(message: FanoutMessage) -> bool:
            if not dropped and isinstance(message, ReplyDetached) and message.confirm:
                dropped.append(message)  # this one second pass only
                return True
            return beyond(message)

        await w.drain(lost)  # the second pass lost; four sweeps go by
        assert dropped
        assert await w.repos.users.deletions() == [], "no sweep sends the reply again"


async def test_the_second_pass_of_a_reply_deleted_between_its_passes_drops_its_row(
    own: Storage,
) -> None:
    """The reply is deleted after its first pass marked it (its delete, built from the
    marked row, drops no index row): its second pass, finding no reply, drops the row before
    the deletion's next sweep, which then ends it."""
    async with world_with(own, TIMING) as w:
        gone, replier, original, reply = await a_reply_then_the_deletion(w)
        s = w.service

        def later(message: FanoutMessage) -> bool:
            """The next sweep and the reply's second pass wait."""
            return isinstance(message, AccountDeleted | ReplyDetached) and message.confirm

        held = await w.drain(later)
        second = [m for m in held if isinstance(m, ReplyDetached)]
        assert len(second) == 1
        await s.posts.delete(replier, replier, reply)
        await w.drain()  # its PostDeleted
        filed = await w.repos.reposts.replies_page(gone, original, 10, None)
        assert filed.items == [(replier, reply)]  # the marked reply's delete kept it
        w.recorder.sent.extend(second)
        await w.drain()
        filed = await w.repos.reposts.replies_page(gone, original, 10, None)
        assert filed.items == [], "the second pass left the index row of a deleted reply"
        w.recorder.sent.extend(m for m in held if isinstance(m, AccountDeleted))
        await w.drain()  # the second sweep finds nothing left
        assert await w.repos.users.deletions() == []
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_late_copy_is_marked_when_one_chain_drops_the_row_while_another_walks(
    own: Storage,
) -> None:
    """The first sweep's chain X marks the reply and notes its row; its second pass waits
    out two sweeps, so the third sends the reply again (chain Y), whose second pass waits
    too. A copy from a read made before X's mark lands meanwhile; X's second pass marks it
    and drops the row while Y is still at work: the deletion ends with no row naming the
    user, and Y's late second pass writes none."""
    async with world_with(own, TIMING) as w:
        gone, replier, reader = await new_users(w.repos, "gone", "replier", "reader")
        s = w.service
        for followee in (gone, replier):
            await s.follows.follow(reader, reader, followee)
        original = (await s.posts.create(gone, gone, "the original")).post_id
        await w.drain()
        answer = await s.posts.create(replier, replier, "an answer", reply_to=(gone, original))
        reply = answer.post_id
        await w.drain()
        stale = await w.repos.posts.get(replier, reply)  # read before the mark
        assert stale is not None
        await s.accounts.delete(gone, gone)
        sweeps = [0]
        chains: list[ReplyDetached] = []

        def hold(message: FanoutMessage) -> bool:
            if isinstance(message, AccountDeleted) and message.phase == "lists":
                sweeps[0] += 1
            if isinstance(message, ReplyDetached) and message.confirm:
                chains.append(message)
                return True
            return sweeps[0] > 3  # sweeps 0, 1 and 2 run

        held = await w.drain(hold)
        assert [m.sweep for m in chains] == [0, 2]  # X, and Y sent by the third sweep
        await submit_batch(own, TIMELINES, reader, [("upsert", stale.to_entity(reader))])
        x_second, y_second = chains
        w.recorder.sent.append(x_second)
        await w.drain(lambda m: isinstance(m, AccountDeleted))
        w.recorder.sent.extend(m for m in held if isinstance(m, AccountDeleted))
        await w.drain(lambda m: m is y_second)
        assert await w.repos.users.deletions() == []
        assert await rows_holding(own, gone) == only_tombstone(gone)
        copy = await copy_of(w.repos, reader, reply)
        assert copy is not None
        assert copy.reply_author == DETACHED
        w.recorder.sent.append(y_second)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)
