"""One post to a huge follower list (continuation messages, bounded memory), and the raw
probe that shows why it cannot finish on Azurite."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from azure.data.tables import UpdateMode
from tqdm import tqdm

from loadtest.bench.harness import (
    DELIVERIES,
    TEXT,
    bounded,
    follower_rows,
    fresh_storage,
    publish,
    worker,
    write_rows,
)
from loadtest.bench.measure import rate
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES


async def bigfanout(sizes: Sizes) -> dict[str, Any]:
    """One post to ``bigfanout_followers`` followers, capped at ``bigfanout_cap_s``.

    Every delivery of one post has the same RowKey, and Azurite finds an entity through its
    RowKey index and then scans all rows sharing that key, so each upsert costs O(copies so
    far) there (real Table Storage looks the key pair up directly). The run is therefore
    capped in time; ``azurite_same_rowkey_eps`` measures that slowdown with raw upserts.
    """
    async with fresh_storage() as (azurites, storage):
        author = "celebrity"
        followers = (f"fan{i:07d}" for i in range(sizes.bigfanout_followers))
        rows = follower_rows(author, followers)
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, "bigfanout: seeding followers")
        async with worker(azurites) as process:
            peak_rss = process.rss_mb()
            started = time.monotonic()
            await publish(storage, Post(new_post_id(now_ticks()), author, TEXT))
            target = sizes.bigfanout_followers + 1
            progress: list[tuple[float, float]] = []
            with tqdm(total=target, desc="bigfanout: delivering", leave=False) as bar:
                while time.monotonic() - started < sizes.bigfanout_cap_s:
                    peak_rss = max(peak_rss, process.rss_mb())
                    delivered = (await process.metrics()).get(DELIVERIES, 0.0)
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
                "bigfanout_first_10s_eps": rate(progress, 0, 10),
                "bigfanout_last_10s_eps": rate(progress, elapsed - 10, elapsed),
            }


async def same_rowkey_probe(per_round: int, rounds: int = 4) -> list[float]:
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


async def bigfanout_phase(sizes: Sizes) -> dict[str, Any]:
    result = await bigfanout(sizes)
    rates = await same_rowkey_probe(sizes.same_rowkey_per_round)
    return result | {"azurite_same_rowkey_eps": [round(r) for r in rates]}
