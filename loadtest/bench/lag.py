"""Lag at half load: how long a post takes to reach its followers when the worker keeps up."""

from __future__ import annotations

from loadtest.bench.harness import DELIVERIES, WorkerProcess, steady_posts, wait_for
from loadtest.bench.measure import histogram_quantile
from loadtest.bench.sizes import Sizes
from timeline.storage.accounts import Storage

LAG = "fanout_delivery_lag_seconds"


async def lag(
    storage: Storage,
    process: WorkerProcess,
    authors: list[str],
    per_post: int,
    live_eps: float,
    sizes: Sizes,
) -> dict[str, float]:
    """Posts at half of ``live_eps`` on the live phase's graph and worker: post created (the
    ticks in its id) to its batch committed, per delivery, from the worker's histogram."""
    before = await process.metrics()
    posted = await steady_posts(
        storage, authors, 0.5 * live_eps / per_post, sizes.lag_seconds, "lag: posting at half load"
    )
    target = before.get(DELIVERIES, 0) + posted * per_post
    await wait_for(process, DELIVERIES, target, "lag: draining")
    after = await process.metrics()
    return {
        "lag_p50_s": histogram_quantile(before, after, LAG, 0.5),
        "lag_p99_s": histogram_quantile(before, after, LAG, 0.99),
    }
