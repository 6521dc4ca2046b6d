"""Inactive readers: a dormancy mark that reaches storage late (held, or orphaned by a failed
sweep) never outlives the wake, nor lands on the next dormancy. Real Azurite; requests are
held (or failed) on the HTTP session (``aiohttp.TraceConfig``), as in
``test_inactive_reader_races``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp

from tests.delivery.helpers import add_posts, run_every_pass
from tests.delivery.test_inactive_reader_races import (
    INACTIVITY,
    LATER,
    WRITES,
    Wire,
    follow_row_write,
    world,
)
from timeline.config import Settings
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.dormancy import Dormancy
from timeline.model.messages import PostCreated
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES
from timeline.tables.follows import INACTIVE_FROM
from timeline.tables.rows import get_entity


@contextlib.asynccontextmanager
async def wired(
    settings: Settings, wire: Wire, *extra: aiohttp.TraceConfig
) -> AsyncIterator[Storage]:
    """A ``Storage`` on the test Azurite through ``wire`` (and ``extra``), no client retries."""
    options = StorageOptions(timeout_s=60.0, retries=0, trace_configs=(wire.config(), *extra))
    async with Storage(settings.connection_string(), options) as storage:
        yield storage


def faults(failing: str, watched: str, landed: asyncio.Event) -> aiohttp.TraceConfig:
    """Every write to ``failing``'s follow rows fails on the wire (a storage error);
    ``landed`` is set when a write to ``watched``'s follow rows got its answer."""
    config = aiohttp.TraceConfig()

    def follow_write(params: Any, partition: str) -> bool:
        row = f"/{SUBJECT_FOLLOWERS}(PartitionKey='{partition}'"
        return params.method in WRITES and row in params.url.path

    async def started(_session: Any, _context: SimpleNamespace, params: Any) -> None:
        if follow_write(params, failing):
            raise aiohttp.ClientConnectionError("connection reset (test)")

    async def ended(_session: Any, _context: SimpleNamespace, params: Any) -> None:
        if follow_write(params, watched):
            landed.set()

    config.on_request_start.append(started)
    config.on_request_end.append(ended)
    return config


async def test_a_sweep_that_fails_on_one_mark_leaves_no_late_mark(
    settings: Settings, storage: Storage
) -> None:
    """A sweep raises at one failed mark while another of its marks is still in flight
    (``gather`` does not cancel it), as a worker dying mid-sweep would leave it; that mark
    lands after the wake, and fails its condition: no follow row is left ``inactive``
    without a marker. Here one author's mark fails on the wire while the other's is held
    past the wake."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=2)
        slow_one, failing_one = w.authors
        await w.pages()  # stamped
        wire = Wire()
        wire.arm(
            lambda method, path: (
                follow_row_write(method, path) and f"PartitionKey='{slow_one}'" in path
            )
        )
        landed = asyncio.Event()
        async with wired(settings, wire, faults(failing_one, slow_one, landed)) as slow:
            sweep = asyncio.create_task(
                Dormancy(slow, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
            )
            await asyncio.wait_for(wire.held.wait(), 20)
            await asyncio.wait([sweep], timeout=20)
            assert sweep.done(), "precondition: the sweep raised at the failed mark"
            assert sweep.exception() is not None, "precondition: the sweep raised"
            await w.pages()  # the reader is back: wake queued, marker "waking"
            await run_every_pass(w.processor, await w.wake_message())
            assert await w.marker_state() is None
            wire.gate.set()
            await asyncio.wait_for(landed.wait(), 20)  # the orphaned mark lands late
            # the check is still filed (the sweep raised): the next sweep judges it
            await Dormancy(slow, INACTIVITY, flag_window_s=60).check(w.reader, time.time())
        assert await w.flagged() == [], "a follow row is marked inactive with no marker"


async def test_a_held_mark_of_an_ended_dormancy_cannot_land_on_the_next_dormancy(
    settings: Settings, storage: Storage
) -> None:
    """Claim 1 against a second dormancy: a mark of the first dormancy, held on the wire past
    its whole wake and past the next dormancy's own marks, is released. Had it landed it
    would bound the row's skips by the first ``since`` while the second wake copies from the
    second ``since``: a post made between the two, fanned out late, would be lost. It fails
    its condition (the row was rewritten twice since it was read), and the post arrives."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        author = w.authors[0]
        await w.pages()  # stamped
        wire = Wire()
        wire.arm(follow_row_write)
        async with wired(settings, wire) as slow:
            sweep = asyncio.create_task(
                Dormancy(slow, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
            )
            await asyncio.wait_for(wire.held.wait(), 20)  # the first dormancy's mark, held
            first = (await w.repos.activity.head(w.reader)).since
            await w.pages()  # the reader is back: wake queued, marker "waking"
            await run_every_pass(w.processor, await w.wake_message())
            assert await w.marker_state() is None
            (between,) = await add_posts(w.repos, author, 1)  # its message still queued
            assert await Dormancy(storage, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
            second = (await w.repos.activity.head(w.reader)).since
            assert first < between.created_at.timestamp() < second
            assert await w.flagged() == [author]
            wire.gate.set()
            assert not await asyncio.wait_for(sweep, 20), "the held mark did not fail"
        row = await get_entity(storage, SUBJECT_FOLLOWERS, author, w.reader)
        assert row is not None
        assert row[INACTIVE_FROM] == second
        await run_every_pass(w.processor, PostCreated(author=author, post_id=between.post_id))
        await w.pages()
        await run_every_pass(w.processor, await w.wake_message())
        assert between.post_id in await w.partition()
