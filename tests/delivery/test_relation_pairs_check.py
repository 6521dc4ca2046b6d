"""The chaos run's check of block and mute pairs (``tests.chaos.invariants``): it finds
what the pass must never leave, and passes what the sweep may leave for a while."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.chaos.invariants import check_relation_pairs
from tests.conftest import eventually
from tests.delivery.test_relation_pairs_races import past
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import RELATIONS
from timeline.tables.relations import MUTED, RelationsRepository, muted_by


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
