"""Late pages: a post to thousands of followers who all followed while no worker ran, so a
backfill for each is queued before it. A worker starts, the author posts, the worker is
SIGKILLed once and another starts. The figure is how long until every follower has the post:
a post's later pages must not wait behind the backfills (each backfill also copies the post,
once the post is stored, so without that the post reaches a follower at its backfill's turn).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import UTC, datetime
from typing import Any

from loadtest.bench.harness import (
    TEXT,
    bounded,
    follower_rows,
    fresh_storage,
    worker,
    write_rows,
)
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.model.messages import Followed, PostCreated
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES
from timeline.storage.queue import FanoutQueues
from timeline.tables.rows import get_entity

AUTHOR = "star"
SAMPLE = 60
"""Followers asked whether they have the post, spread evenly over the follower order (the
fan-out's pages walk it): asking all of them each poll would load the storage measured."""


async def late_pages(sizes: Sizes) -> dict[str, Any]:
    readers = [f"l{i:05d}" for i in range(sizes.late_pages_followers)]
    async with fresh_storage() as (azurites, storage):
        await _seed(storage, readers)
        post = Post(new_post_id(now_ticks()), AUTHOR, TEXT)
        async with worker(azurites) as first:
            await write_rows(storage, POSTS, [post.to_entity(AUTHOR)], "late pages: the post")
            posted = time.monotonic()
            await FanoutQueues(storage).send(PostCreated(author=AUTHOR, post_id=post.post_id))
            await asyncio.sleep(sizes.late_pages_kill_after_s)
            os.kill(first.process.pid, signal.SIGKILL)
        async with worker(azurites):
            reached = await _until_all_have(storage, readers, post, sizes.late_pages_cap_s)
    return {
        "late_pages_followers": len(readers),
        "late_pages_all_have_post_s": reached - posted,
    }


async def _seed(storage: Storage, readers: list[str]) -> None:
    base = now_ticks() - 10_000_000
    old = [Post(new_post_id(base - i * 10), AUTHOR, TEXT) for i in range(5)]
    await write_rows(storage, POSTS, [p.to_entity(AUTHOR) for p in old], "late pages: posts")
    await write_rows(
        storage, SUBJECT_FOLLOWERS, follower_rows(AUTHOR, readers), "late pages: followers"
    )
    since = datetime.now(UTC)
    following = [{"PartitionKey": r, "RowKey": AUTHOR, "since": since} for r in readers]
    await write_rows(storage, SUBJECT_FOLLOWING, following, "late pages: following")
    queues = FanoutQueues(storage)
    await bounded((queues.send(Followed(follower=r, subject=AUTHOR)) for r in readers), 32)


async def _until_all_have(storage: Storage, readers: list[str], post: Post, cap_s: float) -> float:
    """When every sampled follower (the last one always among them) has the post."""
    step = max(1, len(readers) // SAMPLE)
    copy_key = post_row_key(post.post_id)
    waiting = {*readers[::step], readers[-1]}
    deadline = time.monotonic() + cap_s
    while waiting:
        asked = sorted(waiting)
        found = await asyncio.gather(
            *(get_entity(storage, TIMELINES, r, copy_key, select=["author"]) for r in asked)
        )
        waiting = {r for r, row in zip(asked, found, strict=True) if row is None}
        if not waiting:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"late pages: {len(waiting)} sampled followers lack the post")
        await asyncio.sleep(0.5)
    return time.monotonic()
