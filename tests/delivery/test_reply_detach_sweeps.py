"""Replies to a deleted account across the deletion's sweeps (``timeline.delivery.replies``):
a reply deleted between its passes, and a pass lost after its first, still let the
deletion end."""

from __future__ import annotations

from collections.abc import Callable

from tests.delivery.hybrid_helpers import TIMING, new_users
from tests.delivery.test_account_deletion import rows_holding
from tests.delivery.test_account_deletion_races import only_tombstone
from tests.delivery.test_reply_detach_races import world_with
from timeline.model.messages import AccountDeleted, FanoutMessage, ReplyDetached
from timeline.storage.accounts import Storage

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
        gone, replier = await new_users(w.repos, "gone", "replier")
        s = w.service
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        reply = await s.posts.create(
            replier, replier, "an answer", reply_to=(gone, original.post_id)
        )
        await w.drain()
        await s.accounts.delete(gone, gone)

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
        await s.posts.delete(replier, replier, reply.post_id)  # within sweep_delay_s
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
        gone, replier = await new_users(w.repos, "gone", "replier")
        s = w.service
        original = await s.posts.create(gone, gone, "the original")
        await w.drain()
        await s.posts.create(replier, replier, "an answer", reply_to=(gone, original.post_id))
        await w.drain()
        await s.accounts.delete(gone, gone)
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
