"""Live fan-out: posts at a steady rate above the ceiling, one partition per delivery."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from loadtest.bench.ceiling import adjacent_ceiling
from loadtest.bench.floor import live_floor
from loadtest.bench.harness import (
    DELIVERIES,
    WorkerProcess,
    follower_rows,
    fresh_storage,
    steady_posts,
    wait_for,
    worker,
    write_rows,
)
from loadtest.bench.lag import lag
from loadtest.bench.measure import delta, profiled
from loadtest.bench.sizes import Sizes
from timeline.storage.names import SUBJECT_FOLLOWERS


async def live(sizes: Sizes, ceiling: float, profile: Path | None = None) -> dict[str, float]:
    """Authors with disjoint followers, posting round-robin at 1.2 times the single ceiling:
    consecutive posts never share a follower; then the lag phase on the same worker and the
    floor. With ``profile``, the worker is sampled by py-spy while posts arrive."""
    label = "live"
    async with fresh_storage() as (azurites, storage):
        authors = [f"author{a:04d}" for a in range(sizes.live_authors)]
        rows = [
            row
            for a, author in enumerate(authors)
            for row in follower_rows(
                author, (f"fan{a:04d}x{f:04d}" for f in range(sizes.live_followers))
            )
        ]
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, f"{label}: seeding followers")
        per_post = sizes.live_followers + 1  # the author's own timeline too
        probes = [await adjacent_ceiling(storage, sizes, f"{label}: probe before")]
        async with worker(azurites) as process:
            idle = await idle_cores(process)
            before, cpu_before = await process.metrics(), process.cpu_s()
            started = time.monotonic()
            with profiled([process.pid], profile, label):
                posted = await steady_posts(
                    storage,
                    authors,
                    1.2 * ceiling / per_post,
                    sizes.live_seconds,
                    f"{label}: posting",
                )
            after, cpu_after = await process.metrics(), process.cpu_s()
            elapsed = time.monotonic() - started
            deliveries = delta(before, after, DELIVERIES)
            result = {
                "live_eps": deliveries / elapsed,
                "live_requests_per_delivery": delta(
                    before, after, "timeline_storage_requests_total"
                )
                / max(1, deliveries),
                "worker_cpu_ms_per_delivery_live": 1000
                * (cpu_after - cpu_before)
                / max(1, deliveries),
                "worker_idle_cores_live": idle,
                "worker_cpu_ms_per_delivery_live_above_idle": 1000
                * (cpu_after - cpu_before - idle * elapsed)
                / max(1, deliveries),
            }
            target = before.get(DELIVERIES, 0) + posted * per_post
            await wait_for(process, DELIVERIES, target, f"{label}: draining")
            eps = result["live_eps"]
            result |= await lag(storage, process, authors, per_post, eps, sizes)
        probes.append(await adjacent_ceiling(storage, sizes, f"{label}: probe after"))
        result |= await live_floor(storage, sizes.ceiling_entities // 2)
        return result | {"live_adjacent_single_eps": statistics.mean(probes)}


async def idle_cores(process: WorkerProcess, seconds: float = 3.0) -> float:
    """The worker's CPU with nothing to do (empty receives, timers, renewals), in cores: at
    the bench's short idle sleep it is a fixed cost that live posting shares out."""
    await asyncio.sleep(1.0)  # past its start-up
    cpu, started = process.cpu_s(), time.monotonic()
    await asyncio.sleep(seconds)
    return (process.cpu_s() - cpu) / (time.monotonic() - started)
