"""A worker asked to stop returns promptly even while a throttled answer's ``Retry-After``
(up to 30 s) holds background calls back in the storage limiter: a lane's receive must not
wait there (a review found a version whose receives waited in the limiter, which kept a stop
waiting for the hold, then leased messages after the stop only to hand them back)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fanout_worker.worker import Worker
from tests.conftest import make_settings, opened
from timeline.tools.azurite import Azurite

HOLD_S = 30.0


async def test_a_stop_is_not_held_up_by_a_background_receive_waiting_in_the_limiter(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings):
        pass
    worker = Worker(settings, settings.connection_string())
    limiter = worker._limiter
    running = asyncio.create_task(worker.async_run())
    try:
        await asyncio.sleep(1.0)  # the receivers poll their (empty) lanes
        throttled = limiter.slot("queue-receive")  # storage answers one call with a 503
        outcome = await throttled.__aenter__()
        outcome.congested, outcome.retry_after = True, HOLD_S
        await throttled.__aexit__(None, None, None)

        await asyncio.sleep(1.0)  # the background receivers poll through the hold
        asked = time.monotonic()
        worker.stop()
        done, _ = await asyncio.wait({running}, timeout=settings.worker_shutdown_grace_s + 2)
    finally:
        if not running.done():
            await asyncio.wait_for(running, HOLD_S + 10)
    took = time.monotonic() - asked
    assert done, (
        f"the worker took {took:.1f}s to stop (grace {settings.worker_shutdown_grace_s}s,"
        " nothing in flight): a background receive waited out the Retry-After hold in the"
        " limiter"
    )
