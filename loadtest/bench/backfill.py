"""Backfill: several follows of one author with many posts, queued at once."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from loadtest.bench.harness import (
    DELIVERIES,
    TEXT,
    bounded,
    follower_rows,
    fresh_storage,
    wait_for,
    worker,
    write_rows,
)
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Followed
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING
from timeline.storage.queue import FanoutQueues

BACKFILL_POSTS = 250
"""The newest posts a follow copies into the follower's timeline."""


async def backfill(sizes: Sizes) -> dict[str, float]:
    async with fresh_storage() as (azurites, storage):
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
        async with worker(azurites) as process:
            queues = FanoutQueues(storage)
            before = await process.metrics()
            started = time.monotonic()
            await bounded((queues.send(Followed(follower=f, subject=author)) for f in follows), 32)
            per_follow = min(BACKFILL_POSTS, len(posts))
            target = before.get(DELIVERIES, 0) + per_follow * len(follows)
            done = await wait_for(process, DELIVERIES, target, "backfill: copying")
            return {"backfill_eps": per_follow * len(follows) / (done - started)}
