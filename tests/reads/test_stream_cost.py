"""What a live stream's poll costs in real storage requests (counted on the HTTP session),
whatever its look-back window holds, and that late entries are sent however many landed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import aiohttp

from tests.conftest import unique
from timeline.config import Settings
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.reads.home import HomeTimeline
from timeline.reads.live import TimelineWatch
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.calls import chunked, submit_batch
from timeline.storage.names import POSTS, SUBJECT_FOLLOWING, TABLES
from timeline.tables.audience import AudienceRepository

TICKS_PER_SECOND = 10_000_000
LOOKBACK_S = 120.0
WINDOW = 600
"""Entries in the look-back window: more than one old page read held."""


@dataclass
class Requests:
    """Every HTTP request a ``Storage`` sends to one of the data tables."""

    urls: list[str] = field(default_factory=list)

    def config(self) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()

        async def started(_session: Any, _context: SimpleNamespace, params: Any) -> None:
            path = params.url.path
            if any(f"/{table}" in path for table in TABLES):
                self.urls.append(str(params.url))

        config.on_request_start.append(started)
        return config


@contextlib.asynccontextmanager
async def counted(settings: Settings) -> AsyncIterator[tuple[Storage, Requests]]:
    requests = Requests()
    options = StorageOptions(trace_configs=(requests.config(),))
    async with Storage(settings.connection_string(), options) as storage:
        await storage.create_all()
        yield storage, requests


def made_ago(seconds: float, author: str, text: str = "x", nth: int = 0) -> Post:
    ticks = now_ticks() - round(seconds * TICKS_PER_SECOND) + nth
    return Post(new_post_id(ticks), author, text)


async def poll_cost(watch: TimelineWatch, requests: Requests) -> tuple[int, list[Any]]:
    before = len(requests.urls)
    updates = await watch.fresh()
    return len(requests.urls) - before, updates


def watch_of(storage: Storage, owner: str, max_entries: int = 800) -> TimelineWatch:
    home = HomeTimeline(storage, max_merged=20)
    return TimelineWatch(home, owner, lookback_s=LOOKBACK_S, max_entries=max_entries)


async def merge(storage: Storage, reader: str, author: str) -> None:
    """The reader follows the author and merges it (as a finished regrade leaves them)."""
    await AudienceRepository(storage).add_merge(reader, author, 20)
    row = {"PartitionKey": reader, "RowKey": author, "since": datetime.now(UTC), "active": True}
    await submit_batch(storage, SUBJECT_FOLLOWING, reader, [("upsert", row)])


async def add_posts(storage: Storage, author: str, posts: list[Post]) -> None:
    for batch in chunked([("upsert", post.to_entity(author)) for post in posts]):
        await submit_batch(storage, POSTS, author, batch)


async def test_an_idle_poll_of_a_plain_reader_is_one_request_whatever_its_window_holds(
    settings: Settings,
) -> None:
    async with counted(settings) as (storage, requests):
        reader = unique("reader")
        watch = watch_of(storage, reader)
        await watch.open(None)
        entries = [made_ago(60, "friend", nth=i) for i in range(WINDOW)]
        await storage_put(storage, reader, entries)
        cost, updates = await poll_cost(watch, requests)
        assert len(updates) == WINDOW  # a busy poll: one request per 1,000 rows landed
        assert cost == 1 + 1  # and one load of the reader's blocks and mutes, as posts came
        for _ in range(3):
            assert await poll_cost(watch, requests) == (1, [])


async def test_an_idle_poll_of_a_merging_reader_is_one_request_per_source(
    settings: Settings,
) -> None:
    """20 merged authors, one a bot with 600 posts in the window: 21 requests per idle poll
    (once 1,173: every poll re-read the window, a merged author a share of a page at a time)."""
    async with counted(settings) as (storage, requests):
        reader, bot = unique("reader"), unique("bot")
        authors = [bot, *(unique("large") for _ in range(19))]
        for author in authors:
            await merge(storage, reader, author)
        await add_posts(storage, bot, [made_ago(100, bot, nth=i) for i in range(WINDOW)])
        for author in authors[1:]:
            await add_posts(storage, author, [made_ago(30, author)])
        await storage_put(storage, reader, [made_ago(50, "friend", nth=i) for i in range(WINDOW)])
        watch = watch_of(storage, reader)
        await watch.open(None)
        for _ in range(3):
            assert await poll_cost(watch, requests) == (1 + len(authors), [])
        fresh = made_ago(0, bot, "fresh")
        await add_posts(storage, bot, [fresh])
        cost, updates = await poll_cost(watch, requests)
        assert updates == [fresh]
        assert cost == 1 + len(authors) + 2  # and one follow check and one relations load
        assert await poll_cost(watch, requests) == (1 + len(authors), [])


async def test_an_entry_landing_105_s_late_among_800_is_sent(settings: Settings) -> None:
    """Once a poll read only the newest ``cap`` entries of its window: with 800 newer ones,
    an entry landing 105 s late was never sent."""
    async with counted(settings) as (storage, _requests):
        reader = unique("reader")
        watch = watch_of(storage, reader, max_entries=800)
        await watch.open(None)
        newer = [made_ago(10, "friend", nth=i) for i in range(800)]
        late = made_ago(105, "slow", "late")
        await storage_put(storage, reader, newer)
        await storage_put(storage, reader, [late])
        sent = await watch.fresh()
        assert len(sent) == 801
        assert late in sent
        assert sent[0] == late  # oldest first


async def test_a_backfill_of_old_posts_is_not_streamed(settings: Settings) -> None:
    """Entries that land more than the look-back after they were made (a follow's backfill)
    are left to page reads: a stream shows what is new."""
    async with counted(settings) as (storage, _requests):
        reader = unique("reader")
        watch = watch_of(storage, reader)
        await watch.open(None)
        old, recent = made_ago(3600, "friend", "old"), made_ago(1, "friend", "recent")
        await storage_put(storage, reader, [old, recent])
        assert await watch.fresh() == [recent]


async def storage_put(storage: Storage, owner: str, posts: list[Post]) -> None:
    for batch in chunked([("upsert", post.to_entity(owner)) for post in posts]):
        await submit_batch(storage, "timelines", owner, batch)
