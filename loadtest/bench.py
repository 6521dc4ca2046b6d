"""``make bench``: the fan-out worker against the raw storage ceiling, measured in one run.

Every phase starts a fresh in-memory Azurite and a fresh ``fanout-worker`` process, seeds
what it needs through the SDK, and reads the worker's own Prometheus counters. The last line
printed is one JSON object; see loadtest/README.md for the method.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import psutil
from azure.data.tables import UpdateMode
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from timeline.azurite import Azurite, free_ports
from timeline.entities import Post
from timeline.keys import new_post_id, now_ticks
from timeline.messages import Followed, PostCreated, encode
from timeline.queue import FanoutQueue, FanoutQueues
from timeline.storage import (
    POSTS,
    SUBJECT_FOLLOWERS,
    SUBJECT_FOLLOWING,
    TIMELINES,
    Operation,
    Storage,
    StorageOptions,
    chunked,
    submit_batch,
)

TEXT = "x" * 120
"""Timeline-shaped entities: a short post text, like the worker writes."""


@dataclass
class Sizes:
    ceiling_entities: int = 8000
    live_authors: int = 200
    live_followers: int = 100
    live_seconds: float = 20.0
    lag_seconds: float = 15.0
    burst_users: int = 2000
    burst_authors: int = 100
    burst_posts: int = 1000
    backfill_posts: int = 1000
    backfill_follows: int = 24
    bigfanout_followers: int = 100_000
    bigfanout_cap_s: float = 120.0


QUICK = Sizes(
    ceiling_entities=600, live_authors=20, live_followers=20, live_seconds=3, lag_seconds=3,
    burst_users=200, burst_authors=10, burst_posts=50, backfill_posts=300, backfill_follows=2,
    bigfanout_followers=3000, bigfanout_cap_s=60,
)  # fmt: skip


# --- storage and worker plumbing ----------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_storage() -> AsyncIterator[tuple[Azurite, Storage]]:
    azurite = Azurite(location=None)
    await asyncio.to_thread(azurite.start)
    try:
        async with Storage(azurite.connection_string, StorageOptions(timeout_s=30)) as storage:
            await storage.create_all()
            yield azurite, storage
    finally:
        await asyncio.to_thread(azurite.stop)


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Counter and histogram-bucket samples by name (labels folded into the name)."""
    async with session.get(url) as response:
        text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
    return samples


class WorkerProcess:
    """A real ``fanout-worker`` process, observed through its metrics endpoint and RSS."""

    def __init__(self, connection_string: str) -> None:
        (self.port,) = free_ports(1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIMELINE_")}
        env |= {
            "TIMELINE_STORAGE_CONNECTION_STRING": connection_string,
            "TIMELINE_WORKER_METRICS_PORT": str(self.port),
            "TIMELINE_WORKER_IDLE_SLEEP_S": "0.05",
            "TIMELINE_DATA_DIR": tempfile.mkdtemp(prefix="bench-"),
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "fanout_worker"], env=env, stderr=subprocess.DEVNULL
        )
        self.session = aiohttp.ClientSession()

    async def metrics(self) -> dict[str, float]:
        return await scrape(self.session, f"http://127.0.0.1:{self.port}/metrics")

    async def ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                await self.metrics()
                return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the worker did not start")
            await asyncio.sleep(0.1)

    def rss_mb(self) -> float:
        return float(psutil.Process(self.process.pid).memory_info().rss) / 2**20

    async def stop(self) -> None:
        await self.session.close()
        self.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.process.wait, 30)


@contextlib.asynccontextmanager
async def worker(azurite: Azurite) -> AsyncIterator[WorkerProcess]:
    process = WorkerProcess(azurite.connection_string)
    try:
        await process.ready()
        yield process
    finally:
        await process.stop()


async def bounded(
    tasks: Iterable[Awaitable[Any]], limit: int, bar: tqdm[Any] | None = None
) -> None:
    semaphore = asyncio.Semaphore(limit)

    async def run(task: Awaitable[Any]) -> None:
        async with semaphore:
            await task
        if bar is not None:
            bar.update()

    await asyncio.gather(*(run(task) for task in tasks))


async def write_rows(
    storage: Storage, table: str, rows: list[dict[str, Any]], label: str, *, in_flight: int = 16
) -> None:
    """Seed rows with EGT batches, grouped by partition."""
    by_partition: dict[str, list[Operation]] = {}
    for row in rows:
        by_partition.setdefault(row["PartitionKey"], []).append(("upsert", row))
    batches = [
        (partition, batch)
        for partition, operations in by_partition.items()
        for batch in chunked(operations)
    ]
    with tqdm(total=len(batches), desc=label, unit="batch", leave=False) as bar:
        await bounded(
            (submit_batch(storage, table, p, batch) for p, batch in batches), in_flight, bar
        )


def follower_rows(author: str, followers: Iterable[str]) -> list[dict[str, Any]]:
    since = datetime.now(UTC)
    return [{"PartitionKey": author, "RowKey": f, "since": since} for f in followers]


async def publish(storage: Storage, post: Post, *, visible_in_s: int = 0) -> None:
    """What the API does for a post: the source row, then a small message."""
    await submit_batch(storage, POSTS, post.author, [("upsert", post.to_entity(post.author))])
    message = PostCreated(author=post.author, post_id=post.post_id)
    await (
        FanoutQueues(storage)
        .shard_for(message)
        .send_raw(encode(message), visible_in_s=visible_in_s or None)
    )


async def wait_for(
    process: WorkerProcess, metric: str, target: float, label: str, timeout_s: float = 900
) -> float:
    """Poll the worker until ``metric`` reaches ``target``; return when it did (monotonic)."""
    deadline = time.monotonic() + timeout_s
    with tqdm(total=int(target), desc=label, unit="ent", leave=False) as bar:
        while True:
            value = (await process.metrics()).get(metric, 0.0)
            bar.n = int(value)
            bar.refresh()
            if value >= target:
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: {value} of {target} after {timeout_s}s")
            await asyncio.sleep(0.1)


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def histogram_quantile(
    before: dict[str, float], after: dict[str, float], name: str, q: float
) -> float:
    """A quantile of the observations made between two scrapes (linear within a bucket)."""
    buckets = sorted(
        (float(key.split("le=")[1].rstrip("}")), delta(before, after, key))
        for key in after
        if key.startswith(f"{name}_bucket{{")
    )
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


# --- phases ---------------------------------------------------------------------------------


def timeline_entity(partition: str, ticks: int) -> dict[str, Any]:
    return Post(new_post_id(ticks), "author", TEXT).to_entity(partition)


async def single_upsert_rate(storage: Storage, count: int, label: str) -> float:
    """Raw ``upsert_entity`` throughput, 64 in flight, timeline-shaped entities."""
    client = storage.table(TIMELINES, "")
    base = now_ticks()
    entities = [timeline_entity(f"{label}{i:06d}", base + i) for i in range(count)]

    async def upsert(entity: dict[str, Any]) -> None:
        await client.upsert_entity(entity, mode=UpdateMode.REPLACE)

    with tqdm(total=len(entities), desc=f"{label}: single upserts", leave=False) as bar:
        started = time.monotonic()
        await bounded((upsert(e) for e in entities), 64, bar)
        return len(entities) / (time.monotonic() - started)


async def adjacent_ceiling(storage: Storage, sizes: Sizes, label: str) -> float:
    """The single-write ceiling on the phase's own Azurite, moments from the phase itself:
    this shared machine drifts by a third within minutes, so ratios use the mean of one such
    probe just before and one just after the phase."""
    return await single_upsert_rate(storage, sizes.ceiling_entities // 2, label)


async def ceiling_single(sizes: Sizes) -> float:
    async with fresh_storage() as (_, storage):
        return await single_upsert_rate(storage, sizes.ceiling_entities, "ceiling")


async def ceiling_egt(sizes: Sizes) -> float:
    async with fresh_storage() as (_, storage):
        client = storage.table(TIMELINES, "")
        base = now_ticks()
        partitions = sizes.ceiling_entities // 100
        batches = [
            [("upsert", timeline_entity(f"u{p:06d}", base + i)) for i in range(100)]
            for p in range(partitions)
        ]

        async def submit(batch: list[Any]) -> None:
            await client.submit_transaction(batch)

        with tqdm(total=len(batches), desc="ceiling: 100-op EGTs", leave=False) as bar:
            started = time.monotonic()
            await bounded((submit(b) for b in batches), 16, bar)
            return partitions * 100 / (time.monotonic() - started)


async def steady_posts(
    storage: Storage, authors: list[str], posts_per_s: float, seconds: float, label: str
) -> int:
    """Publish posts round-robin over ``authors`` at a steady rate; return how many."""
    count, started = int(posts_per_s * seconds), time.monotonic()
    pending: set[asyncio.Task[None]] = set()
    for i in tqdm(range(count), desc=label, unit="post", leave=False):
        await asyncio.sleep(max(0.0, started + i / posts_per_s - time.monotonic()))
        task = asyncio.create_task(
            publish(storage, Post(new_post_id(now_ticks()), authors[i % len(authors)], TEXT))
        )
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    return count


async def live_and_lag(sizes: Sizes, ceiling: float) -> dict[str, float]:
    """Authors with disjoint followers, posting round-robin: one partition per delivery."""
    async with fresh_storage() as (azurite, storage):
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
        async with worker(azurite) as process:
            offered = 1.2 * ceiling / per_post
            before = await process.metrics()
            started = time.monotonic()
            posted = await steady_posts(
                storage, authors, offered, sizes.live_seconds, "live: posting"
            )
            after = await process.metrics()
            elapsed = time.monotonic() - started
            live_eps = delta(before, after, "fanout_deliveries_total") / elapsed
            live_rpd = delta(before, after, "timeline_storage_requests_total") / max(
                1, delta(before, after, "fanout_deliveries_total")
            )
            await wait_for(
                process,
                "fanout_deliveries_total",
                before.get("fanout_deliveries_total", 0) + posted * per_post,
                "live: draining",
            )

            before = await process.metrics()
            await steady_posts(
                storage,
                authors,
                0.5 * live_eps / per_post,
                sizes.lag_seconds,
                "lag: posting at half load",
            )
            target = (
                before.get("fanout_deliveries_total", 0)
                + int(0.5 * live_eps / per_post * sizes.lag_seconds) * per_post
            )
            await wait_for(process, "fanout_deliveries_total", target, "lag: draining")
            after = await process.metrics()
        probes.append(await adjacent_ceiling(storage, sizes, "live: probe after"))
        lag = "fanout_delivery_lag_seconds"
        return {
            "live_eps": live_eps,
            "live_adjacent_single_eps": statistics.mean(probes),
            "live_requests_per_delivery": live_rpd,
            "lag_p50_s": histogram_quantile(before, after, lag, 0.5),
            "lag_p99_s": histogram_quantile(before, after, lag, 0.99),
        }


async def burst(sizes: Sizes) -> dict[str, float]:
    """A backlog of posts by authors over a shared graph, all visible at the same moment."""
    rng = random.Random(7)
    async with fresh_storage() as (azurite, storage):
        users = [f"user{u:05d}" for u in range(sizes.burst_users)]
        authors = users[: sizes.burst_authors]
        rows = [
            row
            for author in authors
            for row in follower_rows(author, sorted(set(rng.sample(users, 100)) - {author}))
        ]
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, "burst: seeding graph")
        followers = dict.fromkeys(authors, 0)
        for row in rows:
            followers[row["PartitionKey"]] += 1
        probes = [await adjacent_ceiling(storage, sizes, "burst: probe before")]
        async with worker(azurite) as process:
            visible_at = time.monotonic() + 6 + sizes.burst_posts / 400
            posts = [
                Post(new_post_id(now_ticks() + i), authors[i % len(authors)], TEXT)
                for i in range(sizes.burst_posts)
            ]

            async def enqueue(post: Post) -> None:
                await publish(
                    storage, post, visible_in_s=max(1, math.ceil(visible_at - time.monotonic()))
                )

            with tqdm(total=len(posts), desc="burst: building backlog", leave=False) as bar:
                await bounded((enqueue(p) for p in posts), 32, bar)
            await asyncio.sleep(max(0.0, visible_at - time.monotonic()))
            before = await process.metrics()
            started = time.monotonic()
            expected = sum(followers[p.author] + 1 for p in posts)
            done = await wait_for(
                process,
                "fanout_deliveries_total",
                before.get("fanout_deliveries_total", 0) + expected,
                "burst: draining",
            )
            after = await process.metrics()
        probes.append(await adjacent_ceiling(storage, sizes, "burst: probe after"))
        deliveries = delta(before, after, "fanout_deliveries_total")
        return {
            "burst_posts": sizes.burst_posts,
            "burst_eps": deliveries / (done - started),
            "burst_adjacent_single_eps": statistics.mean(probes),
            "burst_requests_per_delivery": delta(before, after, "timeline_storage_requests_total")
            / deliveries,
            "burst_mean_batch": delta(before, after, "fanout_batch_size_sum")
            / max(1, delta(before, after, "fanout_batch_size_count")),
        }


async def backfill(sizes: Sizes) -> float:
    """Several follows of one author with many posts, queued at once."""
    async with fresh_storage() as (azurite, storage):
        author = "prolific"
        base = now_ticks()
        posts = [
            Post(new_post_id(base + i * 10), author, TEXT) for i in range(sizes.backfill_posts)
        ]
        await write_rows(
            storage, POSTS, [p.to_entity(author) for p in posts], "backfill: seeding posts"
        )
        follows = [f"reader{i:04d}" for i in range(sizes.backfill_follows)]
        since = datetime.now(UTC)
        await write_rows(
            storage, SUBJECT_FOLLOWERS, follower_rows(author, follows), "backfill: followers"
        )
        await write_rows(
            storage,
            SUBJECT_FOLLOWING,
            [{"PartitionKey": f, "RowKey": author, "since": since} for f in follows],
            "backfill: following",
        )
        async with worker(azurite) as process:
            queue = FanoutQueue(storage)
            before = await process.metrics()
            started = time.monotonic()
            await bounded((queue.send(Followed(follower=f, subject=author)) for f in follows), 32)
            per_follow = min(250, len(posts))
            done = await wait_for(
                process,
                "fanout_deliveries_total",
                before.get("fanout_deliveries_total", 0) + per_follow * len(follows),
                "backfill: copying",
            )
            return per_follow * len(follows) / (done - started)


async def bigfanout(sizes: Sizes) -> dict[str, Any]:
    """One post to a huge follower list: continuation messages, bounded memory.

    Every delivery of one post has the same RowKey, and Azurite finds an entity through its
    RowKey index and then scans all rows sharing that key, so each upsert costs O(copies so
    far) there (real Table Storage looks the key pair up directly). The run is therefore
    capped in time; ``azurite_same_rowkey_eps`` measures that slowdown with raw upserts.
    """
    async with fresh_storage() as (azurite, storage):
        author = "celebrity"
        followers = (f"fan{i:07d}" for i in range(sizes.bigfanout_followers))
        rows = follower_rows(author, followers)
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, "bigfanout: seeding followers")
        async with worker(azurite) as process:
            peak_rss = process.rss_mb()
            started = time.monotonic()
            await publish(storage, Post(new_post_id(now_ticks()), author, TEXT))
            target = sizes.bigfanout_followers + 1
            progress: list[tuple[float, float]] = []
            with tqdm(total=target, desc="bigfanout: delivering", leave=False) as bar:
                while time.monotonic() - started < sizes.bigfanout_cap_s:
                    peak_rss = max(peak_rss, process.rss_mb())
                    delivered = (await process.metrics()).get("fanout_deliveries_total", 0.0)
                    progress.append((time.monotonic() - started, delivered))
                    bar.n = int(delivered)
                    bar.refresh()
                    if delivered >= target:
                        break
                    await asyncio.sleep(0.2)
            elapsed, delivered = progress[-1]
            return {
                "bigfanout_followers": sizes.bigfanout_followers,
                "bigfanout_delivered": int(delivered),
                "bigfanout_finished": delivered >= target,
                "bigfanout_s": elapsed,
                "bigfanout_rss_mb": peak_rss,
                "bigfanout_first_10s_eps": _rate(progress, 0, 10),
                "bigfanout_last_10s_eps": _rate(progress, elapsed - 10, elapsed),
            }


def _rate(progress: list[tuple[float, float]], start: float, end: float) -> float:
    inside = [(t, n) for t, n in progress if start <= t <= end]
    if len(inside) < 2:
        return math.nan
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / max(t1 - t0, 1e-9)


async def same_rowkey_probe(rounds: int = 4, per_round: int = 2000) -> list[float]:
    """Raw upserts of one RowKey into distinct partitions: rate per round as copies grow."""
    async with fresh_storage() as (_, storage):
        client = storage.table(TIMELINES, "")
        post = Post(new_post_id(now_ticks()), "author", TEXT)
        rates = []
        for r in range(rounds):
            entities = [post.to_entity(f"u{r}x{i:06d}") for i in range(per_round)]
            started = time.monotonic()
            await bounded((client.upsert_entity(e, mode=UpdateMode.REPLACE) for e in entities), 64)
            rates.append(per_round / (time.monotonic() - started))
        return rates


async def run(sizes: Sizes, phases: set[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    phase_list: list[tuple[str, Callable[[], Awaitable[None]]]] = []

    async def ceilings() -> None:
        result["ceiling_single_eps"] = await ceiling_single(sizes)
        result["ceiling_egt_eps"] = await ceiling_egt(sizes)

    async def live() -> None:
        result.update(await live_and_lag(sizes, result["ceiling_single_eps"]))

    async def burst_phase() -> None:
        result.update(await burst(sizes))

    async def backfill_phase() -> None:
        result["backfill_eps"] = await backfill(sizes)

    async def big() -> None:
        result.update(await bigfanout(sizes))
        result["azurite_same_rowkey_eps"] = [round(r) for r in await same_rowkey_probe()]

    phase_list = [("ceilings", ceilings), ("live", live), ("burst", burst_phase),
                  ("backfill", backfill_phase), ("bigfanout", big)]  # fmt: skip
    for name, phase in tqdm(phase_list, desc="bench", unit="phase"):
        if name == "ceilings" or name in phases:
            await phase()
    single, egt = result["ceiling_single_eps"], result["ceiling_egt_eps"]
    ratios = {
        "live_vs_single": result.get("live_eps", math.nan) / single,
        "burst_vs_single": result.get("burst_eps", math.nan) / single,
        "backfill_vs_egt": result.get("backfill_eps", math.nan) / egt,
        "live_vs_adjacent_single": result.get("live_eps", math.nan)
        / result.get("live_adjacent_single_eps", math.nan),
        "burst_vs_adjacent_single": result.get("burst_eps", math.nan)
        / result.get("burst_adjacent_single_eps", math.nan),
    }
    result["ratios"] = {k: round(v, 3) for k, v in ratios.items()}
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--phases", default="live,burst,backfill,bigfanout",
        help="comma-separated subset of live,burst,backfill,bigfanout (ceilings always run)",
    )  # fmt: skip
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the worker and Azurite children are stopped too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    result = asyncio.run(run(QUICK if args.quick else Sizes(), set(args.phases.split(","))))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
