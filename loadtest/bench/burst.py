"""Burst: a backlog of posts over a shared follower graph, all made visible at one instant.

The graph and the backlog are also the workload of the scaling phase."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass

from tqdm import tqdm

from loadtest.bench.ceiling import adjacent_ceiling
from loadtest.bench.harness import (
    DELIVERIES,
    TEXT,
    bounded,
    follower_rows,
    fresh_storage,
    publish,
    wait_for,
    worker,
    write_rows,
)
from loadtest.bench.measure import delta
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS


@dataclass(frozen=True)
class Graph:
    """Authors, each with ``followers`` random followers among ``users`` users."""

    users: int
    authors: int
    followers: int
    seed: int = 7

    def follower_lists(self) -> dict[str, list[str]]:
        rng = random.Random(self.seed)
        users = [f"user{u:05d}" for u in range(self.users)]
        return {
            author: sorted(set(rng.sample(users, self.followers)) - {author})
            for author in users[: self.authors]
        }

    async def seed_into(self, storage: Storage, label: str) -> dict[str, int]:
        """Write the follower rows; return each author's follower count."""
        lists = self.follower_lists()
        rows = [row for author, fans in lists.items() for row in follower_rows(author, fans)]
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, label)
        return {author: len(fans) for author, fans in lists.items()}


async def enqueue_backlog(
    storage: Storage, followers: dict[str, int], posts: int, lead_s: float, label: str
) -> tuple[float, int]:
    """Publish ``posts`` round-robin over the authors, invisible until one instant about
    ``lead_s`` from now; wait for that instant and return it (monotonic) with the deliveries
    the backlog makes (each post also goes to its author's own timeline)."""
    visible_at = time.monotonic() + lead_s
    authors = list(followers)
    backlog = [
        Post(new_post_id(now_ticks() + i), authors[i % len(authors)], TEXT) for i in range(posts)
    ]

    async def enqueue(post: Post) -> None:
        await publish(storage, post, visible_in_s=max(1, math.ceil(visible_at - time.monotonic())))

    with tqdm(total=len(backlog), desc=label, leave=False) as bar:
        await bounded((enqueue(p) for p in backlog), 32, bar)
    await asyncio.sleep(max(0.0, visible_at - time.monotonic()))
    return visible_at, sum(followers[p.author] + 1 for p in backlog)


async def burst(sizes: Sizes) -> dict[str, float]:
    """A backlog of posts by authors over a shared graph, all visible at the same moment."""
    label = "burst"
    graph = Graph(sizes.burst_users, sizes.burst_authors, 100)
    async with fresh_storage() as (azurites, storage):
        followers = await graph.seed_into(storage, f"{label}: seeding graph")
        probes = [await adjacent_ceiling(storage, sizes, f"{label}: probe before")]
        async with worker(azurites) as process:
            lead_s = 6 + sizes.burst_posts / 400
            _, expected = await enqueue_backlog(
                storage, followers, sizes.burst_posts, lead_s, f"{label}: building backlog"
            )
            before, cpu_before = await process.metrics(), process.cpu_s()
            started = time.monotonic()
            done = await wait_for(
                process, DELIVERIES, before.get(DELIVERIES, 0) + expected, f"{label}: draining"
            )
            after, cpu_after = await process.metrics(), process.cpu_s()
        probes.append(await adjacent_ceiling(storage, sizes, f"{label}: probe after"))
        deliveries = delta(before, after, DELIVERIES)
        return {
            "burst_posts": sizes.burst_posts,
            "burst_eps": deliveries / (done - started),
            "burst_adjacent_single_eps": statistics.mean(probes),
            "burst_requests_per_delivery": delta(before, after, "timeline_storage_requests_total")
            / deliveries,
            "burst_mean_batch": delta(before, after, "fanout_batch_size_sum")
            / max(1, delta(before, after, "fanout_batch_size_count")),
            "worker_cpu_ms_per_delivery_burst": 1000 * (cpu_after - cpu_before) / deliveries,
        }
