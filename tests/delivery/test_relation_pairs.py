"""A block or mute is two rows in two partitions (the relation, and its reverse row the other
user's side finds it by). A request can die between them, and two requests on one pair can
interleave; the worker's pass of each request's ``RelationChanged`` makes the reverse row
agree with the relation, so an account's deletion finds every row that names it. The pass
against the expiry sweep, late writes and deletions (each of these failed in a review)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from azure.data.tables import TableEntity

from fanout_worker.sweeper import GRACE_S, Sweeper, SweepReport
from tests.chaos.invariants import check_relation_pairs
from tests.conftest import eventually
from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import World, rows_holding, world
from tests.tables.test_mute_and_filter_lifetime import LATER
from timeline.delivery.outcomes import Continue
from timeline.errors import StorageUnavailableError
from timeline.model.messages import AccountDeleted, FanoutMessage, RelationChanged
from timeline.storage.accounts import Storage
from timeline.storage.names import RELATIONS
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.expiries import DUE, ExpiriesRepository, Expiry
from timeline.tables.relations import BLOCK, BLOCKED_BY, MUTED, RelationsRepository, muted_by
from timeline.tables.rows import get_entity


class Died(Exception):
    """The process died here."""


def dies_writing(monkeypatch: pytest.MonkeyPatch, prefix: str) -> None:
    """The request dies just before it would write a row whose key starts with ``prefix``."""
    upsert = RelationsRepository._upsert

    async def dying(self: RelationsRepository, row: dict[str, Any]) -> None:
        if str(row["RowKey"]).startswith(prefix):
            raise Died
        await upsert(self, row)

    monkeypatch.setattr(RelationsRepository, "_upsert", dying)


def dies_deleting(monkeypatch: pytest.MonkeyPatch, partition_suffix: str, key: str) -> None:
    """The request dies just before it would delete a row of that partition and key prefix."""
    delete = RelationsRepository._delete

    async def dying(self: RelationsRepository, user: str, row_key: str) -> None:
        if user.endswith(partition_suffix) and row_key.startswith(key):
            raise Died
        await delete(self, user, row_key)

    monkeypatch.setattr(RelationsRepository, "_delete", dying)


async def row(storage: Storage, pk: str, rk: str) -> bool:
    return await get_entity(storage, RELATIONS, pk, rk, select=["RowKey"]) is not None


async def test_a_mute_that_died_between_its_rows_leaves_nothing_of_its_muter(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reverse row landed, the mute did not: the pass removes the reverse row, and the
    muter's deletion leaves only its tombstone (before: the reverse row stayed, named it)."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        with monkeypatch.context() as patch:
            dies_writing(patch, MUTED)
            with pytest.raises(Died):
                await w.service.relations.mute(muter, muter, other, None, False)
        assert await row(own, muted_by(other), muter)
        await w.drain()
        assert not await row(own, muted_by(other), muter)
        await w.service.accounts.delete(muter, muter)
        await w.drain()
        assert await rows_holding(own, muter) == [("users", muter, IDENTITY_ROW_KEY)]


async def test_a_block_that_died_between_its_rows_leaves_nothing_of_its_blocker(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "blocked by" row landed, the block did not: the pass removes it (it hid the
    blocker from the other's reads with no block standing)."""
    async with world(own) as w:
        blocker, other = await new_users(w.repos, "blocker", "other")
        with monkeypatch.context() as patch:
            dies_writing(patch, BLOCK)
            with pytest.raises(Died):
                await w.service.relations.block(blocker, blocker, other)
        assert await row(own, other, BLOCKED_BY + blocker)
        await w.drain()
        assert not await row(own, other, BLOCKED_BY + blocker)
        await w.service.accounts.delete(blocker, blocker)
        await w.drain()
        assert await rows_holding(own, blocker) == [("users", blocker, IDENTITY_ROW_KEY)]


async def test_an_unmute_that_died_between_its_rows_leaves_no_reverse_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        await w.service.relations.mute(muter, muter, other, None, True)
        await w.drain()
        with monkeypatch.context() as patch:
            dies_deleting(patch, "~muted", muter)
            with pytest.raises(Died):
                await w.service.relations.unmute(muter, muter, other)
        assert not await row(own, muter, MUTED + other)
        await w.drain()
        assert not await row(own, muted_by(other), muter)


async def test_an_unblock_that_died_between_its_rows_leaves_no_blocked_by_row(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with world(own) as w:
        blocker, other = await new_users(w.repos, "blocker", "other")
        await w.service.relations.block(blocker, blocker, other)
        await w.drain()
        with monkeypatch.context() as patch:
            dies_deleting(patch, other, BLOCKED_BY)
            with pytest.raises(Died):
                await w.service.relations.unblock(blocker, blocker, other)
        await w.drain()
        assert not await row(own, other, BLOCKED_BY + blocker)


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_a_relation_whose_reverse_row_an_interleaving_removed_gets_it_back(
    own: Storage, kind: str
) -> None:
    """A mute's reverse row, then an unmute's two deletes, then the mute's own row: two
    requests interleaved leave the relation without its reverse row; the pass writes it."""
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        relations = w.repos.relations
        if kind == "mute":
            await relations.mute(actor, other, None, False)
            await relations._delete(muted_by(other), actor)
            reverse = (muted_by(other), actor)
        else:
            await relations.block(actor, other)
            await relations._delete(other, BLOCKED_BY + actor)
            reverse = (other, BLOCKED_BY + actor)
        w.recorder.sent.append(RelationChanged(kind=kind, actor=actor, other=other))
        await w.drain()
        assert await row(own, *reverse)


@pytest.mark.parametrize("kind", ["block", "mute"])
async def test_every_block_and_mute_request_sends_its_pass(own: Storage, kind: str) -> None:
    async with world(own) as w:
        actor, other = await new_users(w.repos, "actor", "other")
        s = w.service.relations
        if kind == "mute":
            await s.mute(actor, actor, other, None, False)
            await s.unmute(actor, actor, other)
        else:
            await s.block(actor, actor, other)
            await s.unblock(actor, actor, other)
        passes = [m for m in w.recorder.sent if isinstance(m, RelationChanged)]
        assert passes == [RelationChanged(kind=kind, actor=actor, other=other)] * 2


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
    row only. The mute's pass runs then (a backlog, a retry, or its second pass
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
        await w.service.accounts.delete(muter, muter)
        await w.drain()
        assert await rows_holding(own, muter) == [("users", muter, IDENTITY_ROW_KEY)]


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
    """An interleaving took the reverse row; the mute's second pass reads the mute and
    upserts the reverse row; the call times out
    (the write still in flight at Azure). The muter's deletion's first sweep ends the mute
    (both rows); the pass's retry finds no mute, deletes nothing left and is done. The
    timed-out write lands (within the 30 s Azure may still work on it), before the
    deletion's second sweep, which looks for the muter's mutes in its own partition and
    finds none. A pass after a failed lease is never the last: the next one, once the
    write has landed, deletes both rows of a deleted user."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        await w.service.relations.mute(muter, muter, other, None, False)
        await w.drain()
        await w.repos.relations.delete_pair_row("mute", muter, other, reverse=True)
        second = RelationChanged(kind="mute", actor=muter, other=other, confirm=True)
        in_flight: list[Any] = []
        upsert = RelationsRepository._upsert

        async def timing_out(self: RelationsRepository, entity: dict[str, Any]) -> None:
            in_flight.append(upsert(self, entity))  # sent; Azure works on it later
            raise StorageUnavailableError("injected: the call timed out", retry_after=1)

        with monkeypatch.context() as patch:
            patch.setattr(RelationsRepository, "_upsert", timing_out)
            with pytest.raises(StorageUnavailableError):
                await w.processor.handle(second)
        await w.service.accounts.delete(muter, muter)
        held = await drain_first_sweep(w)
        retry = second.model_copy(update={"attempt": 1})  # the worker counts the failed lease
        outcome = await w.processor.handle(retry)
        assert isinstance(outcome, Continue)  # not the end: a write of it may be in flight
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
        relations = w.repos.relations
        if kind == "mute":
            await relations.mute(actor, other, None, False)
            await relations._delete(muted_by(other), actor)
        else:
            await relations.block(actor, other)
            await relations._delete(other, BLOCKED_BY + actor)
        await w.service.accounts.delete(other, other)
        await w.drain()  # the deletion, both sweeps and the drop
        w.recorder.sent.append(RelationChanged(kind=kind, actor=actor, other=other))
        await w.drain()
        left = await rows_holding(own, other)
        assert left == [("users", other, IDENTITY_ROW_KEY)], left


async def test_the_chaos_check_finds_an_ended_mutes_reverse_row_with_no_mute(
    own: Storage,
) -> None:
    """The chaos run's check sees a reverse row with no mute, even one with an end (no sweep
    can have taken the mute: its end passed less than ``GRACE_S`` ago)."""
    relations = RelationsRepository(own)
    await relations._upsert(
        {"PartitionKey": muted_by("other"), "RowKey": "muter", "expires_at": time.time() - 60}
    )
    with pytest.raises(AssertionError):
        await check_relation_pairs(own)


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
