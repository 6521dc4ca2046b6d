"""The timeline cap: the same workload with the cap on and off; what trimming costs per
delivery and how many rows each leaves behind."""

from __future__ import annotations

from typing import Any

from loadtest.bench.harness import (
    TEXT,
    follower_rows,
    fresh_storage,
    publish,
    wait_for,
    worker,
    write_rows,
)
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES

TRIM_REQUESTS = "fanout_trim_requests_total"
POSTS_DONE = "fanout_messages_total{outcome=done,type=post}"


async def cap(sizes: Sizes) -> dict[str, Any]:
    capped = await _workload(sizes, sizes.cap_items)
    uncapped = await _workload(sizes, 0)
    return {
        "cap_items": sizes.cap_items,
        "cap_deliveries": capped["deliveries"],
        "trim_requests_per_delivery": capped["trim_requests"] / capped["deliveries"],
        "timeline_rows_capped": capped["rows"],
        "timeline_rows_uncapped": uncapped["rows"],
    }


async def _workload(sizes: Sizes, cap_items: int) -> dict[str, float]:
    """Every follower follows every author; each author posts ``cap_posts_per_author``."""
    authors = [f"author{i:03d}" for i in range(sizes.cap_authors)]
    followers = [f"reader{i:04d}" for i in range(sizes.cap_followers)]
    label = f"cap {cap_items or 'off'}"
    async with fresh_storage() as (azurites, storage):
        rows = [row for author in authors for row in follower_rows(author, followers)]
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, f"{label}: seeding follows")
        settings = {"TIMELINE_MAX_TIMELINE_ITEMS": str(cap_items)}
        async with worker(azurites, **settings) as process:
            before = await process.metrics()
            posts = sizes.cap_posts_per_author * len(authors)
            for i in range(posts):  # one at a time: a steady stream, like real posting
                post = Post(new_post_id(now_ticks()), authors[i % len(authors)], TEXT)
                await publish(storage, post)
            deliveries = posts * (len(followers) + 1)
            done = before.get(POSTS_DONE, 0) + posts  # a post's trims end before it is done
            await wait_for(process, POSTS_DONE, done, f"{label}: delivering")
            after = await process.metrics()
        trims = after.get(TRIM_REQUESTS, 0) - before.get(TRIM_REQUESTS, 0)
        return {
            "deliveries": deliveries,
            "trim_requests": trims,
            "rows": await _rows(storage, [*authors, *followers]),
        }


async def _rows(storage: Storage, owners: list[str]) -> int:
    """Timeline entries stored for these owners, counted with key-only queries."""
    count = 0
    for owner in owners:
        async with storage.guard():
            client = storage.reader(TIMELINES, owner)
            entities = client.query_entities(
                "PartitionKey eq @pk", parameters={"pk": owner}, select=["RowKey"]
            )
            count += len([entity async for entity in entities])
    return count
