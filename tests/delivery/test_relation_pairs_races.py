"""The ``RelationChanged`` pass against the expiry sweep, leases that die and slow storage
(each of these failed first in a review); against account deletions:
``test_relation_pairs_deletion``."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableEntity

from fanout_worker.settling import Defer, outcome_of
from fanout_worker.sweeper import GRACE_S, Sweeper, SweepReport
from tests.conftest import eventually, storage_on
from tests.delivery.helpers import Recorder
from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_account_deletion import World, rows_holding, world
from tests.delivery.test_relation_pairs import (
    Died,
    deleted_leaving_its_tombstone,
    dies_writing,
    row,
)
from tests.faults import Delay
from tests.tables.test_mute_and_filter_lifetime import LATER
from timeline.delivery import relations as relations_pass
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.outcomes import DONE, Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.relations import RelationRepair
from timeline.delivery.settings import Timing
from timeline.errors import StorageUnavailableError
from timeline.model.messages import RelationChanged
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.expiries import DUE, ExpiriesRepository, Expiry
from timeline.tables.relations import MUTED, RelationsRepository, muted_by
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


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


async def test_a_fix_on_slow_storage_writes_a_mutes_reverse_row_in_the_end(
    own: Storage, private_azurite: Azurite, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mute with an end whose reverse row an interleaving took. Its fix reads the
    tombstones, then the pair (two rounds of point reads), files the end in ``expiries`` and
    then upserts the reverse row. Were all four calls bound to start within ``FIX_WITHIN_S``
    of the fix's start, storage where a call takes (or waits for its place) more than a
    quarter of it would refuse the upsert every time, and the message would be deferred for
    ever. The bound starts at the reads the writes rest on, which is all it needs (a write
    for a mute read as live lands inside the sweep's grace). Scaled down: ``FIX_WITHIN_S``
    1.5 s, 0.6 s a request."""
    monkeypatch.setattr(relations_pass, "FIX_WITHIN_S", 1.5)
    repos = Repositories.on(own)
    muter, other = await new_users(repos, "muter", "other")
    relations = repos.relations
    await relations.mute(muter, other, time.time() + 3600, False)  # both rows, both filed
    await relations.delete_pair_row("mute", muter, other, reverse=True)  # an interleaving
    slow = Delay(0.6, lambda _method, _url: True)
    async with (
        storage_on([private_azurite], timeout_s=10.0, trace_configs=(slow.config(),)) as store,
        PartitionWriter(store, TIMELINES, linger_s=0) as writer,
    ):
        queue = Recorder(store, forward=False)
        processor = FanoutProcessor.on(store, writer, timing=Timing(), queue=queue)
        fix = RelationChanged(kind="mute", actor=muter, other=other)
        results = [await outcome_of(processor, fix) for _ in range(4)]  # redone after each
    assert await row(own, muted_by(other), muter), results
    assert not all(isinstance(result, Defer) for result in results)
