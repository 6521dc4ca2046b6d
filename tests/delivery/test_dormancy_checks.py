"""A reader's dormancy check survives a wake: the wake files the next check before it deletes
the marker, so a sweep that judges a check meanwhile sees the marker ``waking``. Dropping
that check then left the reader with none, and nothing files another (stamps after the
first do not): the reader never went dormant again (found by review)."""

from __future__ import annotations

import time

import pytest

from fanout_worker.sweeper import Sweeper
from tests.conftest import unique
from timeline.delivery.dormancy import Dormancy
from timeline.storage.accounts import Storage
from timeline.tables.activity import ActivityRepository, Inactivity

INACTIVITY = Inactivity(8.0)
"""An inactive period of 8 s: stamps of 0.57 s."""


@pytest.mark.parametrize("between", ["nothing", "a sweep", "a read and a sweep"])
async def test_a_reader_woken_goes_dormant_again_once_gone(storage: Storage, between: str) -> None:
    """Dormant, then woken; between the wake's filing of the next check and its deletion of
    the marker: nothing, a sweep, or a read (a later stamp) and a sweep. An hour later,
    without another read, the reader is dormant again."""
    repo = ActivityRepository(storage)
    dormancy = Dormancy(storage, INACTIVITY, flag_window_s=60)
    sweeper = Sweeper(storage, claim_lifetime_s=3600, dormancy=dormancy)
    reader = unique("back")
    now = time.time()
    stamp = INACTIVITY.stamp(now)
    await repo.stamp(reader, stamp, INACTIVITY, first=True)
    await sweeper.sweep(now=now + 60)
    head = await repo.head(reader)
    assert head.marker is not None
    assert await repo.mark_waking(reader, head.marker)
    # the wake's last two steps, as Waking.wake takes them, with ``between`` between them
    await repo.file_check(reader, INACTIVITY.due(stamp))  # due already: the wake was long
    if between == "a read and a sweep":
        later = (await repo.head(reader)).stamp_row
        assert await repo.stamp(reader, stamp + 200, INACTIVITY, first=False, read=later)
    if between != "nothing":
        await sweeper.sweep(now=now + 60)
    assert await repo.end_dormancy(reader, head.generation)
    await sweeper.sweep(now=now + 3600)
    assert (await repo.head(reader)).dormant, "no dormancy check left: never dormant again"
