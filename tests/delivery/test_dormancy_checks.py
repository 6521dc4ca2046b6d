"""A reader's dormancy check survives a wake: the wake files the next check before it deletes
the marker, so a sweep that judges a check meanwhile sees the marker ``waking``. Dropping
that check then left the reader with none, and nothing files another (stamps after the
first do not): the reader never went dormant again (found by review)."""

from __future__ import annotations

import time

import pytest

from fanout_worker.sweeper import Sweeper
from tests.conftest import unique
from tests.delivery.helpers import add_users, run_every_pass
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.dormancy import Dormancy
from timeline.delivery.processor import FanoutProcessor
from timeline.model.messages import Wake
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.activity import ActivityRepository, Inactivity
from timeline.tables.repositories import Repositories

INACTIVITY = Inactivity(8.0)
"""An inactive period of 8 s: stamps of 0.57 s."""
OFF = Inactivity(0)


@pytest.mark.parametrize("between", ["nothing", "a sweep", "a read and a sweep"])
async def test_a_reader_woken_goes_dormant_again_once_gone(storage: Storage, between: str) -> None:
    """Dormant, then woken; between the wake's filing of the next check and its deletion of
    the marker: nothing, a sweep, or a read (a later stamp) and a sweep. An hour later,
    without another read, the reader is dormant again."""
    repo = ActivityRepository(storage)
    dormancy = Dormancy(storage, INACTIVITY, flag_window_s=60)
    sweeper = Sweeper(storage, dormancy=dormancy)
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


async def test_checks_wait_while_the_feature_is_off(own: Storage) -> None:
    """A sweep with the feature off (``TIMELINE_INACTIVE_DAYS=0``, or one worker of a
    rolling change) leaves checks untouched: once it is on again, a reader who had stamped
    goes dormant (the sweep dropped the check, and stamps after the first file none)."""
    repo = ActivityRepository(own)
    on = Sweeper(own, dormancy=Dormancy(own, INACTIVITY, flag_window_s=1))
    off = Sweeper(own, dormancy=Dormancy(own, OFF, flag_window_s=1))
    reader = unique("gone")
    now = time.time()
    await repo.stamp(reader, INACTIVITY.stamp(now), INACTIVITY, first=True)
    await off.sweep(now=now + 60)
    assert not (await repo.head(reader)).dormant
    await on.sweep(now=now + 3600)
    assert (await repo.head(reader)).dormant, "the check was lost while the feature was off"


async def test_a_wake_run_with_the_feature_off_files_a_check(own: Storage) -> None:
    """A wake run by a worker with the feature off still files the reader's next check (it
    filed none): once the feature is on again, the reader who stopped goes dormant again."""
    async with PartitionWriter(own, TIMELINES, linger_s=0) as writer:
        repos = Repositories.on(own)
        reader = unique("back")
        await add_users(repos, reader)
        now = time.time()
        await repos.activity.stamp(reader, INACTIVITY.stamp(now), INACTIVITY, first=True)
        dormancy = Dormancy(own, INACTIVITY, flag_window_s=60)
        on = Sweeper(own, dormancy=dormancy)
        await on.sweep(now=now + 60)
        head = await repos.activity.head(reader)
        assert head.marker is not None
        assert await repos.activity.mark_waking(reader, head.marker)
        processor = FanoutProcessor(repos, writer, inactivity=OFF)
        await run_every_pass(processor, Wake(reader=reader, generation=head.generation))
        assert not (await repos.activity.head(reader)).dormant
        await on.sweep(now=now + 3600)
        assert (await repos.activity.head(reader)).dormant, "no check left after the wake"
