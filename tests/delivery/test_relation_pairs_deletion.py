"""The ``RelationChanged`` pass and account deletions: late writes of leases that failed or
died, a deletion's own lease failing between a pair's two deletes, and a deletion that waits
for its blocks' and mutes' passes (each of these failed first in a review)."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import World, rows_holding, world
from tests.delivery.test_relation_pairs import (
    Died,
    row,
    without_reverse_row,
)
from timeline.delivery.outcomes import Continue
from timeline.errors import RetryableError, StorageUnavailableError
from timeline.model.messages import AccountDeleted, FanoutMessage, RelationChanged
from timeline.storage.accounts import Storage
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.relations import BLOCK, BLOCKED_BY, RelationsRepository, muted_by


async def test_a_late_write_of_a_failed_lease_is_undone_after_the_muters_deletion(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interleaving took the reverse row; a fix reads the mute and upserts the reverse
    row; the call times out (the write still in flight at Azure). The muter's deletion's
    first sweep ends the mute (both rows); the fix's retry finds nothing to change. The
    timed-out write lands (within the 30 s Azure may still work on it), before the
    deletion's second sweep, which looks for the muter's mutes in its own partition and
    finds none. A fix never ends its message: the check after it, once the write has
    landed, hands the pair to a fix that deletes both rows of the deleted user."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        await w.service.relations.mute(muter, muter, other, None, False)
        await w.drain()
        await w.repos.relations.delete_pair_row("mute", muter, other, reverse=True)
        fix = RelationChanged(kind="mute", actor=muter, other=other)
        in_flight: list[Any] = []
        upsert = RelationsRepository._upsert

        async def timing_out(self: RelationsRepository, entity: dict[str, Any]) -> None:
            in_flight.append(upsert(self, entity))  # sent; Azure works on it later
            raise StorageUnavailableError("injected: the call timed out", retry_after=1)

        with monkeypatch.context() as patch:
            patch.setattr(RelationsRepository, "_upsert", timing_out)
            with pytest.raises(StorageUnavailableError):
                await w.processor.handle(fix)
        await w.service.accounts.delete(muter, muter)
        held = await drain_first_sweep(w)
        outcome = await w.processor.handle(fix)  # the retry, a fix again: never the end
        assert isinstance(outcome, Continue)
        await in_flight.pop()  # the timed-out write lands
        following = outcome.message.model_copy(update={"attempt": 0})  # as the worker's
        w.recorder.sent.extend([*held, following])  # rewrite of a Continue leaves it
        await w.drain()  # the deletion's second sweep, the drop, the pass once more
        assert await rows_holding(own, muter) == [("users", muter, IDENTITY_ROW_KEY)]


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_a_relation_without_its_reverse_row_goes_with_the_others_deletion(
    own: Storage, kind: Literal["block", "mute"]
) -> None:
    """A block (or mute) and its undo interleave: the relation stands without its reverse
    row (as in ``test_a_relation_whose_reverse_row_an_interleaving_removed_gets_it_back``).
    The other user's deletion finds the pair only by its reverse row, so it ends nothing;
    the pass, held back past the deletion (a backlog, retries through a rebalance: nothing
    orders it before the deletion's last sweep), writes the reverse row into the deleted
    user's side, unless it deletes a pair with a gone side (as ``AccountRemoval.end`` does
    for follows)."""
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        await without_reverse_row(w, kind, actor, other)
        await w.service.accounts.delete(other, other)
        await w.drain()  # the deletion, both sweeps and the drop
        w.recorder.sent.append(RelationChanged(kind=kind, actor=actor, other=other))
        await w.drain()
        left = await rows_holding(own, other)
        assert left == [("users", other, IDENTITY_ROW_KEY)], left


async def drain_first_sweep(w: World) -> list[FanoutMessage]:
    """Run what was sent, holding back an account deletion's second sweep (``confirm``)."""
    work: list[FanoutMessage] = list(w.recorder.sent)
    w.recorder.sent.clear()
    held: list[FanoutMessage] = []
    while work:
        message = work.pop(0)
        outcome = await w.processor.handle(message)
        if isinstance(outcome, Continue):
            following = outcome.message
            first = isinstance(message, AccountDeleted) and not message.confirm
            if isinstance(following, AccountDeleted) and following.confirm and first:
                held.append(following)
            else:
                work.append(following)
        work.extend(w.recorder.sent)
        w.recorder.sent.clear()
    return held


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_a_fix_whose_lease_died_with_its_write_in_flight_is_checked_after_it_lands(
    own: Storage, monkeypatch: pytest.MonkeyPatch, kind: Literal["block", "mute"]
) -> None:
    """An interleaving took the reverse row; a fix reads the tombstones (none), then the
    relation, and upserts the reverse row; the worker is killed with the call in flight
    (Azure may still work on it 30 s; the chaos run lets storage run a request ``STALL_S``
    = 8 s late). The actor's deletion
    begins after the pass's tombstone read, and its first sweep ends the relation (both rows;
    the reverse row is not there yet). The lease ended with no outcome, so the queue gives
    the same message back once the visibility timeout is over (30 s by default, 3 s in the
    chaos run), possibly before the write lands: that fix finds nothing to change. Only a
    check ends a message, ``sweep_delay_s`` after a fix, when every write of the fixes
    before has landed: it finds the row naming the deleted actor and hands it to a fix."""
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        if kind == "mute":
            await w.service.relations.mute(actor, actor, other, None, False)
        else:
            await w.service.relations.block(actor, actor, other)
        await w.drain()
        await w.repos.relations.delete_pair_row(kind, actor, other, reverse=True)
        fix = RelationChanged(kind=kind, actor=actor, other=other)
        in_flight: list[Any] = []
        upsert = RelationsRepository._upsert

        async def killed(self: RelationsRepository, entity: dict[str, Any]) -> None:
            in_flight.append(upsert(self, entity))  # sent; storage works on it later
            raise Died  # the worker is killed: the lease ends with no outcome

        with monkeypatch.context() as patch:
            patch.setattr(RelationsRepository, "_upsert", killed)
            with pytest.raises(Died):
                await w.processor.handle(fix)
        await w.service.accounts.delete(actor, actor)
        held = await drain_first_sweep(w)
        outcome = await w.processor.handle(fix)  # the same message, after the timeout
        await in_flight.pop()  # the write lands
        w.recorder.sent.extend(held)
        if isinstance(outcome, Continue):
            w.recorder.sent.append(outcome.message.model_copy(update={"attempt": 0}))
        await w.drain()  # the deletion's second sweep and its drop (and the pass, if any)
        left = await rows_holding(own, actor)
        assert left == [("users", actor, IDENTITY_ROW_KEY)], (outcome, left)


async def drain_deferring(w: World) -> None:
    """``World.drain``, but as the worker runs a message: one whose run raises a retryable
    error is deferred (``fanout_worker.settling.Defer``) and runs again, unchanged."""
    work = list(w.recorder.sent)
    w.recorder.sent.clear()
    while work:
        message = work.pop(0)
        try:
            outcome = await w.processor.handle(message)
        except RetryableError:
            work.append(message)
            continue
        finally:
            work.extend(w.recorder.sent)
            w.recorder.sent.clear()
        if isinstance(outcome, Continue):
            work.append(outcome.message)


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_a_deletion_whose_lease_fails_between_a_relations_two_deletes_leaves_no_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch, kind: Literal["block", "mute"]
) -> None:
    """The actor's account is deleted. Had its deletion ended the block (or mute) itself,
    deleting the relation (its only handle on the pair) and then the reverse row, a delete
    of the reverse row that timed out would leave the redo nothing to find. The deletion
    sends the pair's ``RelationChanged`` instead, whose fix deletes both rows (a side is
    deleted), and is redone from the message until it has."""
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        s = w.service.relations
        if kind == "block":
            await s.block(actor, actor, other)
            reverse = (other, BLOCKED_BY + actor)
        else:
            await s.mute(actor, actor, other, None, False)
            reverse = (muted_by(other), actor)
        await w.drain()  # the request's pass: both rows agree, its message is done
        assert await row(own, *reverse)
        await w.service.accounts.delete(actor, actor)
        failed: list[str] = []
        delete = RelationsRepository._delete

        async def timing_out(self: RelationsRepository, user: str, key: str) -> None:
            if (user, key) == reverse and not failed:
                failed.append(key)
                raise StorageUnavailableError("injected: the call timed out", retry_after=1)
            await delete(self, user, key)

        with monkeypatch.context() as patch:
            patch.setattr(RelationsRepository, "_delete", timing_out)
            await drain_deferring(w)  # the deletion, deferred once, both sweeps, the drop
        assert failed
        left = await rows_holding(own, actor)
        assert left == [("users", actor, IDENTITY_ROW_KEY)], left


async def drain_holding_relations(w: World, sweeps: int) -> list[FanoutMessage]:
    """``World.drain``, but the deletion's ``RelationChanged`` messages (background work)
    wait (a backlog in the background lane, deferrals, or the poison queue), and the
    deletion stops after ``sweeps`` sweeps. What is held is returned."""
    left = sweeps

    def hold(message: FanoutMessage) -> bool:
        nonlocal left
        if isinstance(message, RelationChanged):
            return message.background
        if isinstance(message, AccountDeleted) and message.phase == "drop":
            left -= 1
            return left < 0
        return False

    return await w.drain(hold)


async def test_a_deletion_stays_in_progress_until_its_blocks_and_mutes_are_gone(
    own: Storage,
) -> None:
    """``timeline stats`` lists an account's deletion until the worker has finished it
    (docs/operations.md: one that waits long has work its sweep keeps finding, and messages
    to look for among the poison). The sweep sends each block's and mute's
    ``RelationChanged``; while they wait (in the background lane, or for good in the poison
    queue), another user's block and mute of the account stand, so the drop waits: its
    check finds the account's own relation rows, which a fix deletes last, and the sweep
    sends the messages again. Once they run, only the tombstone is left."""
    async with world(own) as w:
        gone, blocker, muter = await new_users(w.repos, "gone", "blocker", "muter")
        await w.service.relations.block(blocker, blocker, gone)
        await w.service.relations.mute(muter, muter, gone, None, False)
        await w.drain()  # both requests' passes: every pair agrees
        await w.service.accounts.delete(gone, gone)
        held = await drain_holding_relations(w, sweeps=3)
        assert sum(isinstance(m, RelationChanged) for m in held) >= 2 * 3  # sent each sweep
        assert await w.repos.users.deletions() == [gone]
        assert await row(own, blocker, BLOCK + gone)
        w.recorder.sent.extend(held)
        await w.drain()
        assert await w.repos.users.deletions() == []
        assert await rows_holding(own, gone) == [("users", gone, IDENTITY_ROW_KEY)]
