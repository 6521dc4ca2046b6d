"""A block or mute is two rows in two partitions (the relation, and its reverse row the other
user's side finds it by). A request can die between them, and two requests on one pair can
interleave; the worker's pass of each request's ``RelationChanged`` makes the reverse row
agree with the relation, so an account's deletion finds every row that names it. The pass
against the expiry sweep, late writes and deletions (each of these failed in a review)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
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
from timeline.delivery.outcomes import DONE, Continue
from timeline.errors import StorageUnavailableError
from timeline.model.messages import AccountDeleted, FanoutMessage, RelationChanged
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
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


async def test_the_chaos_check_finds_an_ended_mute_whose_reverse_row_outlives_it(
    own: Storage,
) -> None:
    """The state the test above would reach before the sweep: a mute whose end has passed,
    and a reverse row with no end, which the sweep would keep when it takes the mute."""
    relations = RelationsRepository(own)
    ended = time.time() - 1
    await relations._upsert(
        {"PartitionKey": "muter", "RowKey": MUTED + "other", "expires_at": ended, "reposts": True}
    )
    await relations._upsert({"PartitionKey": muted_by("other"), "RowKey": "muter"})
    with pytest.raises(AssertionError):
        await check_relation_pairs(own)


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


async def test_a_mutes_end_round_trips_exactly(own: Storage) -> None:
    """The pass compares ends as floats after a round trip through Azurite; odd fractions,
    whole numbers and far ends all compare equal, so a check after agreement ends."""
    async with world(own) as w:
        muter, *others = await new_users(w.repos, "muter", "a", "b", "c", "d")
        now = time.time()
        ends = [now + 1234.5678901234567, float(int(now) + 7200), now + 99 * 365 * 86_400, None]
        for other, end in zip(others, ends, strict=True):
            until = None if end is None else datetime.fromtimestamp(end, UTC)
            await w.service.relations.mute(muter, muter, other, until, True)
        w.recorder.sent.clear()
        for other in others:
            before = await get_entity(own, RELATIONS, muted_by(other), muter)
            assert before is not None
            message = RelationChanged(kind="mute", actor=muter, other=other, confirm=True)
            assert await w.processor.handle(message) == DONE
            after = await get_entity(own, RELATIONS, muted_by(other), muter)
            assert after is not None
            assert after.metadata["etag"] == before.metadata["etag"]


async def test_the_chaos_check_passes_a_mute_the_sweep_takes_while_it_lists(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos check lists the tables while the workers' sweep (every second in the chaos
    run) goes on. A mute ending just before a minute's end (index rows
    are filed by the minute) is swept ``GRACE_S`` after that minute, which can fall within
    the listing: taken whole by the sweep after the check read its reverse row and before it
    reads the mute, it leaves the check a reverse row with no mute, whose end is ``GRACE_S`` past
    by the listing's end (but not by its start). Here the listing's second page
    (past 1,000 rows) comes after the sweep; in the chaos run, the next account's. The clock
    is moved on (every ``time.time`` of the process) so the test need not wait for it."""
    relations = RelationsRepository(own)
    muter, other = "zz-muter", "aa-other"  # the reverse row's partition sorts first
    filler = [
        ("upsert", {"PartitionKey": "mm-filler", "RowKey": f"f-{i:04}", "phrase": "x"})
        for i in range(1000)
    ]
    for start in range(0, len(filler), 100):
        await submit_batch(own, RELATIONS, "mm-filler", filler[start : start + 100])
    real = time.time
    minute = (int(real()) // 60 + 1) * 60  # a minute's end
    ends = minute - 0.1
    await relations.mute(muter, other, ends, True)  # both rows, and their index rows
    offset = ends + GRACE_S - 0.2 - real()  # the check starts 0.2 s before end + grace
    monkeypatch.setattr(time, "time", lambda: real() + offset)
    assert len(own.account_ids) == 1
    account_table = Storage.account_table

    def slow_listing(self: Storage, account: int, table: str) -> Any:
        client = account_table(self, account, table)
        if table != RELATIONS:
            return client

        class Listing:
            def __getattr__(self, name: str) -> Any:
                return getattr(client, name)

            async def list_entities(self, **kwargs: Any) -> AsyncIterator[Any]:
                count = 0
                async for entity in client.list_entities(**kwargs):
                    yield entity
                    count += 1
                    if count == 1000:  # before the next page: the sweep's round
                        await eventually(
                            lambda: past(minute + GRACE_S), timeout_s=5, what="the grace"
                        )
                        report = await Sweeper(own).sweep()
                        assert report.removed == 2, report

        return Listing()

    with monkeypatch.context() as patch:
        patch.setattr(Storage, "account_table", slow_listing)
        await check_relation_pairs(own)  # nothing is wrong: the sweep took both rows
