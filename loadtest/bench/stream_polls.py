"""What one live-stream poll costs in storage requests, counted on the HTTP session of the
storage client (every request the stream's reads send, nothing else): idle, for a plain
reader with a full look-back window and for one merging 20 large authors, one of them a bot
with 600 posts in the window; and busy, with entries landing between polls."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import aiohttp

from loadtest.bench.harness import TEXT
from timeline.model.entities import Post
from timeline.model.keys import TICKS_PER_SECOND, new_post_id, now_ticks
from timeline.reads.home import HomeTimeline
from timeline.reads.live import TimelineWatch
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.calls import chunked, submit_batch
from timeline.storage.names import POSTS, SUBJECT_FOLLOWING, TABLES, TIMELINES
from timeline.tables.audience import AudienceRepository

LOOKBACK_S = 120.0
"""The default ``TIMELINE_STREAM_LOOKBACK_S``."""
WINDOW = 600
"""Entries in the look-back window of the plain reader, and posts of the merged bot."""
MERGED = 20
"""Merged authors of the merging reader (the default ``TIMELINE_MAX_MERGED_AUTHORS``)."""
POLLS = 10
BUSY_ENTRIES = 20
"""Entries landing between two busy polls (a reader following very active accounts)."""


class _Counter:
    def __init__(self) -> None:
        self.count = 0

    def config(self) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()

        async def started(_session: Any, _context: SimpleNamespace, params: Any) -> None:
            if any(f"/{table}" in params.url.path for table in TABLES):
                self.count += 1

        config.on_request_start.append(started)
        return config


@contextlib.asynccontextmanager
async def _counted(strings: Sequence[str]) -> AsyncIterator[tuple[Storage, _Counter]]:
    counter = _Counter()
    async with Storage(list(strings), StorageOptions(trace_configs=(counter.config(),))) as storage:
        yield storage, counter


def _made(seconds_ago: float, author: str, nth: int = 0) -> Post:
    return Post(
        new_post_id(now_ticks() - round(seconds_ago * TICKS_PER_SECOND) + nth), author, TEXT
    )


async def _put(storage: Storage, table: str, partition: str, posts: list[Post]) -> None:
    for batch in chunked([("upsert", post.to_entity(partition)) for post in posts]):
        await submit_batch(storage, table, partition, batch)


async def _seed(storage: Storage, plain: str, merging: str, bot: str) -> None:
    window = [_made(60, "friend", i) for i in range(WINDOW)]
    await _put(storage, TIMELINES, plain, window)
    await _put(storage, TIMELINES, merging, window)
    authors = [bot, *(f"{merging}-large{i}" for i in range(MERGED - 1))]
    audience = AudienceRepository(storage)
    for author in authors:
        await audience.add_merge(merging, author, MERGED)
        row = {"PartitionKey": merging, "RowKey": author, "since": datetime.now(UTC)}
        await submit_batch(
            storage, SUBJECT_FOLLOWING, merging, [("upsert", row | {"active": True})]
        )
        await _put(storage, POSTS, author, [_made(30, author)])
    await _put(storage, POSTS, bot, [_made(100, bot, i) for i in range(WINDOW)])


async def _per_poll(watch: TimelineWatch, counter: _Counter, land: Any = None) -> float:
    """The stream's requests per poll (the writes of ``land``, before each poll, excluded)."""
    total = 0
    for _ in range(POLLS):
        if land is not None:
            await land()
        before = counter.count
        await watch.fresh()
        total += counter.count - before
    return total / POLLS


async def poll_requests(strings: Sequence[str]) -> dict[str, float]:
    """Requests per poll: idle (plain, merging), and busy (plain, merging)."""
    plain, merging, bot = "pollplain", "pollmerging", "pollbot"
    async with _counted(strings) as (storage, counter):
        await _seed(storage, plain, merging, bot)
        home = HomeTimeline(storage, max_merged=MERGED)
        watches = {}
        for reader in (plain, merging):
            watches[reader] = TimelineWatch(home, reader, lookback_s=LOOKBACK_S, max_entries=800)
            await watches[reader].open(None)

        async def land_plain() -> None:
            await _put(
                storage, TIMELINES, plain, [_made(1, "friend", i) for i in range(BUSY_ENTRIES)]
            )

        async def land_merging() -> None:
            await _put(storage, POSTS, bot, [_made(0, bot)])
            await _put(
                storage, TIMELINES, merging, [_made(1, "friend", i) for i in range(BUSY_ENTRIES)]
            )

        return {
            "stream_idle_poll_requests": await _per_poll(watches[plain], counter),
            f"stream_idle_poll_requests_merging_{MERGED}": await _per_poll(
                watches[merging], counter
            ),
            "stream_busy_poll_requests": await _per_poll(watches[plain], counter, land_plain),
            f"stream_busy_poll_requests_merging_{MERGED}": await _per_poll(
                watches[merging], counter, land_merging
            ),
        }
