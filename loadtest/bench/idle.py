"""Idle cost: what a worker with nothing to do spends in receives and CPU, with idle back-off
(the default settings) and without (the max sleep equal to the idle sleep, as before)."""

from __future__ import annotations

import asyncio
import time

from loadtest.bench.harness import fresh_storage, suffixed, worker
from loadtest.bench.measure import delta
from loadtest.bench.sizes import Sizes
from timeline.config import Settings
from timeline.model.priority import Priority
from timeline.storage.queue import FanoutQueue

EMPTY = "fanout_receives_total{result=empty}"
LEASED = "fanout_receives_total{result=leased}"
WARM_UP_S = 5.0
"""Past start-up and the back-off's doublings (0.5, 1, then 2 s by default)."""


def default(name: str) -> str:
    """A setting's default, as the worker's environment spells it."""
    return str(Settings.model_fields[name].default)


async def idle(sizes: Sizes) -> dict[str, float]:
    """The same idle measure with the default back-off, then without it (keys ``_no_backoff``)."""
    base = default("worker_idle_sleep_s")
    backoff = await one_idle(sizes, base, default("worker_idle_max_sleep_s"))
    flat = await one_idle(sizes, base, base)
    return (
        backoff
        | suffixed(flat, "_no_backoff")
        | {
            "worker_idle_receives_vs_no_backoff": backoff["worker_idle_receives_per_s"]
            / flat["worker_idle_receives_per_s"]
        }
    )


async def one_idle(sizes: Sizes, sleep_s: str, max_sleep_s: str) -> dict[str, float]:
    """One worker on one empty shard: receives a second and cores over ``idle_seconds``,
    then how long a first message waits to be leased."""
    settings = {
        "TIMELINE_WORKER_IDLE_SLEEP_S": sleep_s,
        "TIMELINE_WORKER_IDLE_MAX_SLEEP_S": max_sleep_s,
    }
    async with fresh_storage() as (azurites, storage), worker(azurites, **settings) as process:
        await asyncio.sleep(WARM_UP_S)
        before, cpu, started = await process.metrics(), process.cpu_s(), time.monotonic()
        await asyncio.sleep(sizes.idle_seconds)
        after, cpu_after = await process.metrics(), process.cpu_s()
        elapsed = time.monotonic() - started
        await FanoutQueue(storage).send_raw("not a fan-out message", level=Priority.HIGH)
        sent = time.monotonic()
        while True:  # scraped often: the scrapes' own CPU no longer counts here
            if (await process.metrics()).get(LEASED, 0.0) >= 1:
                break
            await asyncio.sleep(0.02)
        return {
            "worker_idle_receives_per_s": delta(before, after, EMPTY) / elapsed,
            "worker_idle_cores": (cpu_after - cpu) / elapsed,
            "worker_idle_first_lease_s": time.monotonic() - sent,
        }
