"""Inactive readers under races and cost: each test protects a behaviour a review found
missing (each failed on 4d1cee0); the docstring says how it went wrong in production and what
the test stands in for. Real Azurite throughout: requests
are counted, and one is held, on the HTTP session (``aiohttp.TraceConfig``), never faked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp

from tests.conftest import unique
from tests.delivery.helpers import add_follow, add_posts, add_users, run_every_pass
from timeline.config import Settings
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.dormancy import Dormancy
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.metrics import DELIVERIES
from timeline.model.entities import Post
from timeline.model.messages import PostCreated, Wake
from timeline.reads.activity import Attendance
from timeline.reads.home import HomeTimeline, Position
from timeline.reads.live import TimelineWatch
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.names import SUBJECT_FOLLOWERS, TABLES, TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.activity import MARKER_ROW, STATE, Inactivity
from timeline.tables.follows import INACTIVE
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity

INACTIVITY = Inactivity.days(0.0005)
LATER = 10**10
"""The sweep is driven with a ``now`` past every due time instead of waiting for it."""
WRITES = frozenset({"PUT", "PATCH", "MERGE", "POST", "DELETE"})


@dataclass
class Wire:
    """Every data-table request a ``Storage`` sends; ``arm`` holds the next request that
    matches at ``gate`` (after its caller decided to send it, before it reaches storage)."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    answered: list[tuple[str, str, int]] = field(default_factory=list)
    matches: Callable[[str, str], bool] | None = None
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)

    def arm(self, matches: Callable[[str, str], bool]) -> None:
        self.matches, self.gate, self.held = matches, asyncio.Event(), asyncio.Event()

    def config(self) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()

        async def started(_session: Any, _context: SimpleNamespace, params: Any) -> None:
            path = params.url.path
            if not any(f"/{table}" in path for table in TABLES):
                return
            self.requests.append((params.method, str(params.url)))
            if self.matches is not None and self.matches(params.method, path):
                self.matches = None
                self.held.set()
                await self.gate.wait()

        async def ended(_session: Any, _context: SimpleNamespace, params: Any) -> None:
            if any(f"/{table}" in params.url.path for table in TABLES):
                self.answered.append((params.method, str(params.url), params.response.status))

        config.on_request_start.append(started)
        config.on_request_end.append(ended)
        return config

    def count(self, *, method: str | None = None, contains: str = "") -> int:
        return sum(
            1
            for verb, url in self.requests
            if (method is None or verb == method) and contains in url
        )


def follow_row_write(method: str, path: str) -> bool:
    return method in WRITES and f"/{SUBJECT_FOLLOWERS}(" in path


def posts_query(method: str, path: str) -> bool:
    return method == "GET" and path.rstrip("/").endswith("/posts()")


@contextlib.asynccontextmanager
async def wired(settings: Settings, wire: Wire) -> AsyncIterator[Storage]:
    """A ``Storage`` on the test Azurite whose requests go through ``wire`` (a long storage
    timeout: a held request must not be cut by the guard)."""
    options = StorageOptions(timeout_s=60.0, trace_configs=(wire.config(),))
    async with Storage(settings.connection_string(), options) as storage:
        yield storage


@dataclass
class World:
    storage: Storage
    repos: Repositories
    processor: FanoutProcessor
    home: HomeTimeline
    reader: str
    authors: list[str]

    async def post(self, author: str, count: int = 1) -> list[str]:
        posts = await add_posts(self.repos, author, count)
        for post in posts:
            await run_every_pass(self.processor, PostCreated(author=author, post_id=post.post_id))
        return [post.post_id for post in posts]

    async def pages(self, limit: int = 250) -> list[str]:
        ids: list[str] = []
        position: Position | None = Position()
        while position is not None:
            posts, position = await self.home.page(self.reader, limit, position)
            ids += [post.post_id for post in posts]
        return ids

    async def partition(self) -> list[str]:
        return [p.post_id for p in (await self.repos.timelines.page(self.reader, 1000, None)).items]

    async def marker_state(self) -> str | None:
        row = await get_entity(self.storage, TIMELINES, self.reader, MARKER_ROW)
        return None if row is None else str(row[STATE])

    async def flagged(self) -> list[str]:
        rows = [
            await get_entity(self.storage, SUBJECT_FOLLOWERS, author, self.reader)
            for author in self.authors
        ]
        return [a for a, row in zip(self.authors, rows, strict=True) if row and row.get(INACTIVE)]

    async def wake_message(self) -> Wake:
        head = await self.repos.activity.head(self.reader)
        return Wake(reader=self.reader, generation=head.generation)

    async def go_dormant(self, dormancy: Dormancy) -> None:
        """The reader read once (stamped), then a sweep found it inactive."""
        await self.pages()
        assert await dormancy.check(self.reader, LATER)
        assert await self.marker_state() == "dormant"


async def world(
    storage: Storage,
    writer: PartitionWriter,
    authors: int = 3,
    *,
    resend_after_s: float = 600.0,
    home_storage: Storage | None = None,
    dormant_authors: int = 200,
) -> World:
    repos = Repositories.on(storage)
    reader, names = unique("reader"), [unique("author") for _ in range(authors)]
    await add_users(repos, reader, *names)
    await asyncio.gather(*(add_follow(repos, reader, author) for author in names))
    on = home_storage or storage
    attendance = Attendance(
        Repositories.on(on).activity, FanoutQueue(on), INACTIVITY, resend_after_s=resend_after_s
    )
    home = HomeTimeline(on, max_merged=20, attendance=attendance, dormant_authors=dormant_authors)
    processor = FanoutProcessor(repos, writer, inactivity=INACTIVITY)
    return World(storage, repos, processor, home, reader, names)


async def test_a_sweep_mark_held_past_its_window_and_the_wake_does_not_land(
    settings: Settings, storage: Storage
) -> None:
    """A mark that passed the window check, then waited (as for a limiter place) longer
    than the window while the reader returned and the wake ran both passes: it cannot land
    (its condition is the follow row as read before the marker), so no follow row is left
    ``inactive`` without a marker and the author's next post reaches the reader."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        author = w.authors[0]
        await w.post(author)
        await w.pages()  # stamped
        wire = Wire()
        wire.arm(follow_row_write)
        async with wired(settings, wire) as slow:
            window = 0.05
            sweep = asyncio.create_task(
                Dormancy(slow, INACTIVITY, flag_window_s=window).check(w.reader, LATER)
            )
            await asyncio.wait_for(wire.held.wait(), 20)  # passed the window check
            held_at = time.monotonic()
            assert await w.marker_state() == "dormant"
            await w.pages()  # the reader is back: wake queued, marker "waking"
            await run_every_pass(w.processor, await w.wake_message())
            assert await w.marker_state() is None
            # The window is a span of time, so the hold must outlast it on the clock.
            await asyncio.sleep(max(0.0, window - (time.monotonic() - held_at)) + 0.01)
            assert time.monotonic() - held_at > window, "precondition: held past the window"
            wire.gate.set()
            assert not await asyncio.wait_for(sweep, 20), "the held mark did not fail"
        late = await w.post(author)
        assert late[0] in await w.pages(), "an active reader missed a post"
        assert await w.flagged() == [], "a follow row is marked inactive with no marker"


async def test_reads_during_a_long_wake_do_not_keep_it_from_ending(
    settings: Settings, storage: Storage
) -> None:
    """Was (medium): a wake that never ends (and multiplies its own work).

    A read that finds the marker ``waking`` for longer than ``resend_after_s`` (2 S) queues
    a new ``Wake`` and rewrites the marker (``mark_waking``: new ``wake_at``, new ETag). A
    wake's second pass reads the marker first, restores every author, then deletes the
    marker only "if unchanged since read": a read during that restore makes it fail, and it
    returns DONE; the resent wake runs both passes again, and a read during its second
    restore does the same. A restore takes longer than 2 S for a reader following thousands
    of authors (5,000 ``copy_newest`` calls per pass) or behind a backlog (the second pass
    is LOW priority). While such a reader keeps reading, the marker never goes, every page
    stays a full merge (see the cost test below), and every 2 S another full restore runs.

    ``resend_after_s=0`` stands in for "this read came more than 2 S after the marker moved
    to waking"; the read is made while the second pass's restore is held at its posts query."""
    wire = Wire()
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=0) as writer,
        wired(settings, wire) as slow,
    ):
        w = await world(storage, writer, authors=2, resend_after_s=0.0)
        for author in w.authors:
            await w.post(author)
        await w.go_dormant(Dormancy(storage, INACTIVITY, flag_window_s=60))
        await w.pages()  # the return: wake queued, marker "waking"
        waking = FanoutProcessor(Repositories.on(slow), writer, inactivity=INACTIVITY)
        for _ in range(3):
            first = await waking.handle(await w.wake_message())
            assert isinstance(first, Continue)
            wire.arm(posts_query)
            second = asyncio.create_task(run_every_pass(waking, first.message))
            await asyncio.wait_for(wire.held.wait(), 20)  # the second pass is restoring
            await w.pages()  # a read meanwhile (stale: the wake is resent)
            wire.gate.set()
            await asyncio.wait_for(second, 20)
            if await w.marker_state() is None:
                break
        assert await w.marker_state() is None, "three wakes ran, the reader is still dormant"


async def test_a_dormant_page_costs_a_bounded_number_of_requests(
    settings: Settings, storage: Storage
) -> None:
    """Was (high, cost): a dormant reader's every page costs one query per followed
    author, unbounded.

    ``_dormant_page`` reads every follow (one query per 1,000 follows) and then one
    ``posts`` query per followed author, on every page (continuations carry ``d``), each
    asking ``max(10, 250 / (n + 1))`` rows. A merged (hybrid) page is bounded by
    ``max_merged`` (20 to 40) sources; a dormant page is not: 60 follows cost 61 queries
    here, 5,000 follows cost 5,001 queries and read 50,000 rows per page. And the page is
    cut at the bound of the densest source, so a page may hold as few as 10 posts: reading
    down to the cap (800) may take 80 such pages. This holds for every read during the
    wake too (until the marker goes, which the previous test shows may be never).

    The bound asserted: what a merged page may cost (``max_merged`` authors, the head and
    the follow check), independent of how many authors the reader follows."""
    authors, bound = 60, 16
    wire = Wire()
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=0) as writer,
        wired(settings, wire) as counted,
    ):
        w = await world(
            storage, writer, authors=authors, home_storage=counted, dormant_authors=bound
        )
        await asyncio.gather(*(add_posts(w.repos, author, 2) for author in w.authors))
        await w.go_dormant(Dormancy(storage, INACTIVITY, flag_window_s=60))
        _, position = await w.home.page(w.reader, 25, Position())
        assert position is not None
        assert position.dormant
        before = len(wire.requests)
        second, _ = await w.home.page(w.reader, 25, position)
        cost = len(wire.requests) - before
        assert second, "precondition: a second dormant page"
        assert cost <= bound + 4, f"one dormant page cost {cost} storage requests"


async def test_a_wake_copies_only_what_the_dormancy_skipped(storage: Storage) -> None:
    """Was (medium, cost): the wake's first pass rewrites every followed author's
    newest 250 posts, whether or not any was skipped.

    ``Waking._restore`` calls ``copy_newest(missing_only=False)`` per author: up to
    ``250 * authors`` entity writes (1.25 M for 5,000 follows, then trimmed back to the cap
    of 800 by one trim per author), and the second pass reads every author's copies again.
    A reader who was dormant for a day and missed nothing costs a full rebuild, and one
    who goes dormant every ``TIMELINE_INACTIVE_DAYS`` costs more than the fan-out it saved.
    Only posts made since the dormancy began can be missing (and at most the cap of them).

    Here nothing was posted during the dormancy: nothing should be written."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=3)
        for author in w.authors:
            await w.post(author, 20)
        await w.go_dormant(Dormancy(storage, INACTIVITY, flag_window_s=60))
        held = sorted(await w.partition())
        await w.pages()  # the return: wake queued
        before = DELIVERIES._value.get()
        await run_every_pass(w.processor, await w.wake_message())
        written = DELIVERIES._value.get() - before
        assert sorted(await w.partition()) == held
        assert written == 0, f"the wake wrote {written:g} copies; the dormancy skipped none"


async def test_concurrent_reads_in_one_period_write_the_stamp_once(
    settings: Settings, storage: Storage
) -> None:
    """Was (low, cost): "at most one stamp write per reader per period" holds only
    for reads one after another. Each first page decides from the stamp its own head query
    returned, so reads that start together (several tabs or devices, the web client's page
    and stream opening at once, several API processes) each write ``!a``; the first stamp
    of a reader also files its dormancy check once per such read."""
    wire = Wire()
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=0) as writer,
        wired(settings, wire) as counted,
    ):
        w = await world(storage, writer, authors=1, home_storage=counted)
        await w.repos.activity.stamp(w.reader, INACTIVITY.stamp() - 1, INACTIVITY, first=True)
        await asyncio.gather(*(w.home.page(w.reader, 25, Position()) for _ in range(4)))
        writes = [
            status
            for method, url, status in wire.answered
            if method in WRITES and ("RowKey='%21a'" in url or "RowKey='!a'" in url)
        ]
        assert len([s for s in writes if s < 300]) == 1, f"stamp writes in one period: {writes}"
        assert all(s < 300 or s in (409, 412) for s in writes), writes


async def test_a_reader_streaming_through_the_inactive_period_still_gets_posts(
    storage: Storage,
) -> None:
    """Was (low): an active reader whose stream is open misses posts.

    A stream counts as activity only when it opens (``Timelines.watch`` calls ``touch``
    once); its polls never stamp. A stream left open past ``TIMELINE_INACTIVE_DAYS`` (a
    dashboard, a tab that never reloads), or opened just as a sweep read the old stamp
    (``touch`` read the head before the marker was written, so it queued no wake), leaves
    a connected reader dormant: its stream reads only its partition, which gets no copies,
    and nothing wakes it until a page is read or the stream reopens.

    ``LATER`` stands in for the stream staying open through the inactive period."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        await w.home.touch(w.reader)  # the stream opens: stamped
        watch = TimelineWatch(w.home, w.reader, lookback_s=60, max_entries=800)
        await watch.open(None)
        assert await Dormancy(storage, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
        await watch.fresh()  # the stream polls on, as it does every few seconds
        assert await w.marker_state() == "waking", "the poll that saw the marker queued no wake"
        await run_every_pass(w.processor, await w.wake_message())
        posted = await w.post(w.authors[0])
        sent = [update.post_id for update in await watch.fresh() if isinstance(update, Post)]
        assert posted[0] in sent, "a post never reached an open stream"
