"""The ``RelationChanged`` pass against the expiry sweep, late writes, leases that die, and
account deletions (each of these failed first in a review)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from azure.data.tables import TableEntity

from fanout_worker.sweeper import GRACE_S, Sweeper, SweepReport
from tests.conftest import eventually
from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import World, rows_holding, world
from tests.delivery.test_relation_pairs import (
    Died,
    deleted_leaving_its_tombstone,
    dies_writing,
    row,
    without_reverse_row,
)
from tests.tables.test_mute_and_filter_lifetime import LATER
from timeline.delivery import relations as relations_pass
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.outcomes import DONE, Continue
from timeline.delivery.relations import RelationRepair
from timeline.delivery.settings import Timing
from timeline.errors import RetryableError, StorageUnavailableError
from timeline.model.messages import AccountDeleted, FanoutMessage, RelationChanged
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.expiries import DUE, ExpiriesRepository, Expiry
from timeline.tables.relations import BLOCKED_BY, MUTED, RelationsRepository, muted_by


async def muted_briefly(w: World, muter: str, other: str) -> float:
    """A mute that ends in a second (its pass held back: nothing run yet); its end."""
    ends = datetime.now(UTC) + timedelta(seconds=1)
    await w.service.relations.mute(muter, muter, other, ends, False)
    return ends.timestamp()


async def past(moment: float) -> bool:
    return time.time() > moment


async def due(storage: Storage, at: float) -> list[Expiry]:
    rows: list[Expiry] = []
    for account in range(len(storage.account_ids)):
        rows.extend((await ExpiriesRepository(storage).due_page(account, DUE, at, None)).items)
    return rows


async def test_a_pass_after_the_sweep_took_the_reverse_row_leaves_it_gone(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep removes an ended mute's two rows one by one (two index rows, each in its
    own shard); a rebalance freezes the muter's partition, so this round takes the reverse
    row only. The mute's pass runs then (a backlog, a retry, or a fix after its check
    ``sweep_delay_s`` after a short mute): it reads the ended mute, still there, and writes
    the reverse row again, with no index row to sweep it: it must leave an ended mute's rows
    to the sweep."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        ends = await muted_briefly(w, muter, other)
        passes = list(w.recorder.sent)
        w.recorder.sent.clear()
        sweeper, later = Sweeper(own), time.time() + LATER
        delete = Sweeper._delete

        async def frozen(self: Sweeper, expiry: Expiry, read: TableEntity) -> bool:
            if expiry.pk == muter:
                raise StorageUnavailableError("injected: a rebalance froze it", retry_after=1)
            return await delete(self, expiry, read)

        with monkeypatch.context() as patch:
            patch.setattr(Sweeper, "_delete", frozen)
            await sweeper.sweep(now=later)
        assert not await row(own, muted_by(other), muter)
        assert await row(own, muter, MUTED + other)
        await eventually(lambda: past(ends), timeout_s=5, what="the mute's end")
        w.recorder.sent.extend(passes)
        await w.drain()  # the mute's passes, both, after its end (as the sweep is)
        await sweeper.sweep(now=later)  # the partition thawed: the mute goes
        assert not await row(own, muter, MUTED + other)
        assert await deleted_leaving_its_tombstone(w, muter)


async def test_a_pass_between_the_sweeps_read_and_delete_leaves_it_to_the_sweep(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep reads the ended mute's reverse row; a pass rewrites it (same fields, a new
    etag); the sweep's conditional delete fails, and it drops the index row anyway (a row
    that changed is taken to be filed anew): a pass writes only a row that disagrees."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        await muted_briefly(w, muter, other)
        await w.drain()
        sweeper, later = Sweeper(own), time.time() + LATER
        rows = await due(own, later - GRACE_S)
        reverse = next(e for e in rows if e.pk == muted_by(other))
        relation = next(e for e in rows if e.pk == muter)
        read = Sweeper._read

        async def racing(self: Sweeper, expiry: Expiry) -> TableEntity | None:
            found = await read(self, expiry)
            if expiry.pk == muted_by(other):  # a pass of the mute, between read and delete
                await w.processor.handle(RelationChanged(kind="mute", actor=muter, other=other))
            return found

        report = SweepReport()
        with monkeypatch.context() as patch:
            patch.setattr(Sweeper, "_read", racing)
            await sweeper._settle(reverse, later, report)
        await sweeper._settle(relation, later, report)
        await sweeper.sweep(now=later)  # a later round, in case anything is left filed
        assert not await row(own, muter, MUTED + other)
        assert not await row(own, muted_by(other), muter), "an ended mute's reverse row stays"


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


@pytest.mark.parametrize("new_end_s", [None, 3600.0])
async def test_an_ended_mute_meeting_a_mute_that_died_between_its_rows_leaves_no_reverse_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch, new_end_s: float | None
) -> None:
    """A short mute (both rows, its end filed). The muter mutes again (no end, or an hour's:
    the chaos workload's two other kinds), and the request dies between its rows: the reverse
    row now says "no end" (or an hour), the mute still has the short end. The request's pass
    shows once hidden time is over (60 s by default, 13 s in the chaos run), after the short
    end. Left to the sweep, the mute would go (its end passed) and the reverse row stay (no
    end, or not yet), naming the muter: the pass deletes a reverse row that does not carry
    its ended mute's end."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        ends = await muted_briefly(w, muter, other)
        await w.drain()
        again = None if new_end_s is None else datetime.now(UTC) + timedelta(seconds=new_end_s)
        with monkeypatch.context() as patch:
            dies_writing(patch, MUTED)
            with pytest.raises(Died):
                await w.service.relations.mute(muter, muter, other, again, True)
        await eventually(lambda: past(ends), timeout_s=5, what="the short mute's end")
        await w.drain()  # the dead request's pass, once its message shows
        await Sweeper(own).sweep(now=time.time() + LATER)
        mute = await row(own, muter, MUTED + other)
        reverse = await row(own, muted_by(other), muter)
        await w.service.accounts.delete(muter, muter)
        await w.drain()
        left = await rows_holding(own, muter)
        gone = [("users", muter, IDENTITY_ROW_KEY)]
        assert (mute, reverse, left) == (False, False, gone), (mute, reverse, left)


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


async def test_a_fixs_write_held_past_its_bound_is_refused_so_the_sweep_finds_no_late_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fix reads a mute that ends soon and no reverse row (an interleaving took it); its
    upsert of the reverse row waits in the limiter (a backlog). Were it sent whenever its
    place came (the default write deadline, 300 s, is longer than the sweep's ``GRACE_S`` of
    120 s), it could land after the sweep found the reverse row missing and dropped its index
    row, and the row would stay unfiled once the mute is swept. A fix sends nothing later
    than ``FIX_WITHIN_S`` after its start (well inside ``GRACE_S``; here made short): the
    write is refused, the fix is redone, and by then the mute has ended."""
    monkeypatch.setattr(relations_pass, "FIX_WITHIN_S", 0.5)
    async with world(own) as w, PartitionWriter(own, TIMELINES, linger_s=0) as writer:
        muter, other = await new_users(w.repos, "muter", "other")
        relations = w.repos.relations
        ends = time.time() + 1
        await relations.mute(muter, other, ends, False)  # both rows and both index rows
        await relations.delete_pair_row("mute", muter, other, reverse=True)
        repair = RelationRepair(Context(w.repos, writer, timing=Timing()))  # the defaults
        fix = RelationChanged(kind="mute", actor=muter, other=other)
        started, upsert = time.monotonic(), RelationsRepository._upsert

        async def in_the_limiter(self: RelationsRepository, entity: dict[str, Any]) -> None:
            await eventually(  # its place in the limiter comes after the fix's bound
                lambda: past_monotonic(started + 0.5), timeout_s=5, what="the fix's bound"
            )
            await upsert(self, entity)

        with monkeypatch.context() as patch:
            patch.setattr(RelationsRepository, "_upsert", in_the_limiter)
            with pytest.raises(StorageUnavailableError):
                await repair.settle(fix)
        assert not await row(own, muted_by(other), muter)  # refused, never sent
        await eventually(lambda: past(ends), timeout_s=5, what="the mute's end")
        check = await repair.settle(fix)  # the fix redone: an ended mute, nothing to write
        assert isinstance(check, Continue)
        assert isinstance(check.message, RelationChanged)
        assert await repair.settle(check.message) == DONE
        await Sweeper(own).sweep(now=time.time() + LATER)
        assert not await row(own, muter, MUTED + other)
        assert not await row(own, muted_by(other), muter)


async def past_monotonic(moment: float) -> bool:
    return time.monotonic() > moment
