"""Review of a4ff4bb: a worker asked to stop returns promptly even when a receiver waits in
the storage limiter. Since cc3a6dd a lane's receive waits there for a place at the lane's
priority; ``stop()`` wakes receivers waiting for room in the intake, but nothing wakes one
waiting in the limiter, and the shutdown grace period only starts once every receiver has
returned. A throttled answer's ``Retry-After`` (up to 30 s) holds background calls back, so a
background receiver caught in the hold keeps the worker from stopping until it passes, and
then leases messages after the stop (only to hand them back)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from fanout_worker.worker import Worker
from tests.conftest import eventually, make_settings, opened
from timeline.model.priority import Priority
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

        async def background_receiver_held() -> bool:
            return limiter.waiting(Priority.LOW) >= 1

        await eventually(background_receiver_held, timeout_s=10, what="a held background receive")
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
