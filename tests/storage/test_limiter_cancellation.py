"""Cancelling tasks that wait in the storage limiter (the worker's shutdown cancels every
message task still running, in one loop) must leave them cancelled, nothing else."""

from __future__ import annotations

import asyncio

from timeline.model.priority import Priority
from timeline.storage.flow.limiter import AdaptiveLimiter, LimiterSettings


async def test_tasks_cancelled_together_end_cancelled_not_with_value_error() -> None:
    limiter = AdaptiveLimiter(LimiterSettings(initial=1, minimum=1, maximum=1))

    async def storage_call() -> None:
        async with limiter.slot():
            await asyncio.Event().wait()  # a request in flight, never answered

    holder = asyncio.create_task(storage_call())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(storage_call())
    await asyncio.sleep(0)
    assert (limiter.in_flight, limiter.waiting(Priority.HIGH)) == (1, 1)
    for task in (holder, waiter):  # as Worker._shutdown cancels what is still pending
        task.cancel()
    results = await asyncio.gather(holder, waiter, return_exceptions=True)
    assert [type(result) for result in results] == [asyncio.CancelledError] * 2, results
    assert limiter.in_flight == 0
