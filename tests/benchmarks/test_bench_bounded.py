"""The bench's ``bounded``: at most ``limit`` awaitables in flight, and a run cancelled
midway (as the inactive phase stops its readers) leaves no coroutine created and never
awaited."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from loadtest.bench.harness import bounded

LIMIT = 4


async def test_a_cancelled_run_leaves_no_coroutine_unawaited() -> None:
    release, all_in_flight = asyncio.Event(), asyncio.Event()
    started = 0

    async def read() -> None:
        nonlocal started
        started += 1
        if started == LIMIT:
            all_in_flight.set()
        await release.wait()

    reads = (read() for _ in range(3 * LIMIT))
    running = asyncio.create_task(bounded(reads, LIMIT))
    await all_in_flight.wait()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        gc.collect()  # a coroutine never awaited warns when it is collected
    assert started == LIMIT
    assert [str(warning.message) for warning in caught] == []
