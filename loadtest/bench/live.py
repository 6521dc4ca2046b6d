"""Live fan-out: posts at a steady rate above the ceiling, one partition per delivery."""

from __future__ import annotations

import statistics
import time

from loadtest.bench.ceiling import adjacent_ceiling
from loadtest.bench.harness import (
    DELIVERIES,
    follower_rows,
    fresh_storage,
    steady_posts,
    wait_for,
    worker,
    write_rows,
)
from loadtest.bench.lag import lag
from loadtest.bench.measure import delta
from loadtest.bench.sizes import Sizes
from timeline.storage.names import SUBJECT_FOLLOWERS


async def live(sizes: Sizes, ceiling: float) -> dict[str, float]:
    """Authors with disjoint followers, posting round-robin at 1.2 times the single ceiling:
    consecutive posts never share a follower. The lag phase then runs on the same worker."""
    async with fresh_storage() as (azurites, storage):
        authors = [f"author{a:04d}" for a in range(sizes.live_authors)]
        rows = [
            row
            for a, author in enumerate(authors)
            for row in follower_rows(
                author, (f"fan{a:04d}x{f:04d}" for f in range(sizes.live_followers))
            )
        ]
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, "live: seeding followers")
        per_post = sizes.live_followers + 1  # the author's own timeline too
        probes = [await adjacent_ceiling(storage, sizes, "live: probe before")]
        async with worker(azurites) as process:
            before, cpu_before = await process.metrics(), process.cpu_s()
            started = time.monotonic()
            posted = await steady_posts(
                storage, authors, 1.2 * ceiling / per_post, sizes.live_seconds, "live: posting"
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
            }
            target = before.get(DELIVERIES, 0) + posted * per_post
            await wait_for(process, DELIVERIES, target, "live: draining")
            result |= await lag(storage, process, authors, per_post, result["live_eps"], sizes)
        probes.append(await adjacent_ceiling(storage, sizes, "live: probe after"))
        return result | {"live_adjacent_single_eps": statistics.mean(probes)}
