"""Inactive readers: what dormancy saves the fan-out, and what a returning reader pays.

One graph, seeded twice on fresh Azurites: readers of which 70% never read, following
authors who post. With the feature on (a period of seconds), every reader is stamped as
registration does, the readers who read keep reading through a real API process, and the
worker's own sweep makes the others dormant; the same posts then fan out on a worker with
the feature off (``TIMELINE_INACTIVE_DAYS=0``). Returning readers each follow 200 authors:
their first pages while dormant (merged from ``posts``), the wake's duration, and their first
pages after it are measured, each checked to be the newest 250 posts of those authors."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from loadtest.bench.api import PAGE, REQUESTS, SECRET, ApiProcess, api_process
from loadtest.bench.harness import (
    DELIVERIES,
    TEXT,
    WorkerProcess,
    bounded,
    fresh_storage,
    publish,
    worker,
    write_rows,
)
from loadtest.bench.measure import delta
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES
from timeline.tables.activity import ActivityRepository, Inactivity
from timeline.tables.follows import INACTIVE

SKIPPED = "timeline_inactive_skipped_total"
INACTIVE_SHARE = 0.7
RETURN_FOLLOWING = 200
TIMING = {
    "TIMELINE_STORAGE_TIMEOUT_S": "5",
    "TIMELINE_WORKER_WRITE_DEADLINE_S": "3",
    "TIMELINE_WORKER_SWEEP_DELAY_S": "9",
    "TIMELINE_EXPIRY_SWEEP_INTERVAL_S": "1",
}
"""Short protocol bounds, so dormancy starts and a wake ends within seconds (the wake's
second pass waits the sweep delay: 9 s here, 360 s by default)."""
TIMEOUT_S = 300.0


class Graph:
    """Readers ``r…`` (every tenth index below 7 never reads), authors ``a…`` with
    ``inactive_followers`` each, and returning readers ``back…`` following 200 ``lib…``
    authors who do not post during the run."""

    def __init__(self, sizes: Sizes) -> None:
        self.readers = [f"r{i:05d}" for i in range(sizes.inactive_readers)]
        self.idle = {r for i, r in enumerate(self.readers) if i % 10 < INACTIVE_SHARE * 10}
        self.authors = [f"a{i:03d}" for i in range(sizes.inactive_authors)]
        step = max(1, len(self.readers) // len(self.authors))
        self.followers = {
            a: [
                self.readers[(n * step + j) % len(self.readers)]
                for j in range(sizes.inactive_followers)
            ]
            for n, a in enumerate(self.authors)
        }
        self.returning = [f"back{i:02d}" for i in range(sizes.inactive_returning)]
        self.library = [f"lib{i:03d}" for i in range(RETURN_FOLLOWING)]
        base = now_ticks() - 10**10
        per_author = sizes.inactive_library_posts
        self.library_posts = [
            Post(new_post_id(base + (i * len(self.library) + n) * 10), author, TEXT)
            for i in range(per_author)
            for n, author in enumerate(self.library)
        ]
        self.newest = [p.post_id for p in sorted(self.library_posts, key=lambda p: p.row_key)][
            :PAGE
        ]

    def pairs(self) -> list[tuple[str, str]]:
        """Every (author, follower) pair."""
        plain = [(a, f) for a, fans in self.followers.items() for f in fans]
        return plain + [(lib, r) for lib in self.library for r in self.returning]

    def flagged_pairs(self) -> int:
        """Follow rows a finished dormancy marks: those of the readers who never read."""
        return sum(1 for _, f in self.pairs() if f in self.idle or f in self.returning)

    async def seed(self, storage: Storage) -> None:
        since = datetime.now(UTC)
        pairs = self.pairs()
        followers = [{"PartitionKey": a, "RowKey": f, "since": since} for a, f in pairs]
        following = [
            {"PartitionKey": f, "RowKey": a, "since": since, "active": True} for a, f in pairs
        ]
        await write_rows(storage, SUBJECT_FOLLOWERS, followers, "inactive: followers")
        await write_rows(storage, SUBJECT_FOLLOWING, following, "inactive: following", in_flight=32)
        posts = [p.to_entity(p.author) for p in self.library_posts]
        await write_rows(storage, POSTS, posts, "inactive: library posts")
        # the copies their fan-out left before the dormancy (the wake restores only later posts)
        copies = [p.to_entity(r) for r in self.returning for p in self.library_posts]
        await write_rows(storage, TIMELINES, copies, "inactive: library copies")


async def inactive(sizes: Sizes) -> dict[str, float]:
    graph = Graph(sizes)
    on = await _feature_on(graph, sizes)
    off = await _fan_out_only(graph, sizes)
    return on | {
        "inactive_deliveries_saved": 1 - on.pop("deliveries") / off["deliveries"],
        "inactive_worker_cpu_ms_per_post_off": off["cpu_ms_per_post"],
        "inactive_readers_share": INACTIVE_SHARE,
        "inactive_return_following": RETURN_FOLLOWING,
        "inactive_wake_sweep_delay_s": float(TIMING["TIMELINE_WORKER_SWEEP_DELAY_S"]),
    }


async def _fan_out_only(graph: Graph, sizes: Sizes) -> dict[str, float]:
    """The same posts with the feature off: every follower gets its copy."""
    async with fresh_storage() as (azurites, storage):
        await graph.seed(storage)
        async with worker(azurites, TIMELINE_INACTIVE_DAYS="0", **TIMING) as process:
            return await _post(storage, process, graph, sizes, "inactive (off): posting")


async def _feature_on(graph: Graph, sizes: Sizes) -> dict[str, Any]:
    settings = TIMING | {"TIMELINE_INACTIVE_DAYS": str(sizes.inactive_period_s / 86_400)}
    inactivity = Inactivity(sizes.inactive_period_s)
    async with fresh_storage() as (azurites, storage):
        await graph.seed(storage)
        repo = ActivityRepository(storage)
        everyone = graph.readers + graph.returning
        await bounded(
            (repo.stamp(r, inactivity.stamp(), inactivity, first=True) for r in everyone), 32
        )
        async with api_process(azurites, **settings) as server, worker(azurites, **settings) as w:
            reader = Reader(server)
            active = [r for r in graph.readers if r not in graph.idle]
            keeping = asyncio.create_task(reader.keep_active(active, sizes.inactive_period_s / 3))
            try:
                await _until_flagged(storage, graph.flagged_pairs())
                posted = await _post(storage, w, graph, sizes, "inactive (on): posting")
                flagged = await _flagged(storage)
            finally:
                keeping.cancel()
                await asyncio.gather(keeping, return_exceptions=True)
            if flagged != graph.flagged_pairs():
                raise RuntimeError(f"{flagged} follow rows marked, {graph.flagged_pairs()} meant")
            returned = await _return(reader, repo, graph, sizes, inactivity)
    return returned | {
        "deliveries": posted["deliveries"],
        "inactive_worker_cpu_ms_per_post": posted["cpu_ms_per_post"],
    }


async def _post(
    storage: Storage, process: WorkerProcess, graph: Graph, sizes: Sizes, label: str
) -> dict[str, float]:
    """Publish ``inactive_posts`` round-robin over the authors, wait until each follower
    was either written or skipped; the worker's CPU and deliveries meanwhile."""
    posts = [
        Post(new_post_id(now_ticks() + i), graph.authors[i % len(graph.authors)], TEXT)
        for i in range(sizes.inactive_posts)
    ]
    expected = sum(len(graph.followers[p.author]) + 1 for p in posts)
    before, cpu_before = await process.metrics(), process.cpu_s()
    await bounded((publish(storage, post) for post in posts), 16)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        after = await process.metrics()
        reached = delta(before, after, DELIVERIES) + delta(before, after, SKIPPED)
        if reached >= expected:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: {reached} of {expected} followers reached")
        await asyncio.sleep(0.2)
    cpu = process.cpu_s() - cpu_before
    return {
        "deliveries": delta(before, after, DELIVERIES),
        "cpu_ms_per_post": 1000 * cpu / len(posts),
    }


async def _flagged(storage: Storage) -> int:
    """Follow rows marked inactive (one key-only scan of the table)."""
    table = storage.account_table(0, SUBJECT_FOLLOWERS)
    rows = table.list_entities(select=["RowKey", INACTIVE])
    return sum([1 async for row in rows if row.get(INACTIVE)])


async def _until_flagged(storage: Storage, target: int) -> None:
    """Wait for the worker's sweep to make every reader who does not read dormant."""
    deadline = time.monotonic() + TIMEOUT_S
    while (flagged := await _flagged(storage)) < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"inactive: {flagged} of {target} follow rows marked")
        await asyncio.sleep(0.5)


class Reader:
    """Home timeline reads through the API, timed, with the API's storage requests."""

    def __init__(self, server: ApiProcess) -> None:
        self._server = server
        self._signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)

    async def page(self, user: str) -> tuple[list[str], float, float]:
        """The first page's post ids, its latency (ms) and the storage requests it took."""
        before = await self._server.metrics()
        started = time.perf_counter()
        ids = await self.ids(user)
        elapsed = 1000 * (time.perf_counter() - started)
        return ids, elapsed, delta(before, await self._server.metrics(), REQUESTS)

    async def ids(self, user: str) -> list[str]:
        headers = {"Authorization": f"Bearer {self._signer.mint_bearer(user)}"}
        url = f"{self._server.base}/users/{user}/timeline"
        async with self._server.session.get(url, headers=headers) as response:
            return [item["post_id"] for item in (await response.json())["items"]]

    async def keep_active(self, readers: Sequence[str], every_s: float) -> None:
        """Each of ``readers`` reads once every ``every_s``, so it stays active."""
        while True:
            started = time.monotonic()
            await bounded((self.ids(r) for r in readers), 8)
            await asyncio.sleep(max(0.0, started + every_s - time.monotonic()))


async def _return(
    reader: Reader, repo: ActivityRepository, graph: Graph, sizes: Sizes, inactivity: Inactivity
) -> dict[str, float]:
    """Each returning reader reads while dormant (the first read queues the wake), then,
    once that dormancy's marker is gone, reads its rebuilt timeline; every page is checked
    complete, and each after the wake served from the partition (no marker)."""
    dormant_ms: list[float] = []
    requests: list[float] = []
    returned: dict[str, tuple[str, float]] = {}
    for user in graph.returning:
        head = await repo.head(user)
        if not head.dormant:
            raise RuntimeError(f"{user} is not dormant before its return")
        returned[user] = head.generation, time.monotonic()
        for _ in range(sizes.inactive_tries):
            ids, ms, used = await reader.page(user)
            _check(user, ids, graph.newest, "while dormant")
            if (await repo.head(user)).dormant:  # the page was served merged
                dormant_ms.append(ms)
                requests.append(used)
    keeping = asyncio.create_task(_keep_stamped(repo, graph.returning, inactivity))
    try:
        wakes = await asyncio.gather(*(_woken(repo, u, *returned[u]) for u in graph.returning))
        rebuilt_ms: list[float] = []
        for user in graph.returning:
            for _ in range(sizes.inactive_tries):
                ids, ms, _used = await reader.page(user)
                _check(user, ids, graph.newest, "after the wake")
                if (await repo.head(user)).dormant:
                    raise RuntimeError(f"{user} went dormant again: a merged page, not rebuilt")
                rebuilt_ms.append(ms)
    finally:
        keeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping  # raises what stopped it early
    return {
        "inactive_return_first_page_ms": statistics.median(dormant_ms),
        "inactive_return_first_page_storage_requests": statistics.median(requests),
        "inactive_rebuilt_first_page_ms": statistics.median(rebuilt_ms),
        "inactive_wake_s": statistics.median(wakes),
    }


async def _keep_stamped(
    repo: ActivityRepository, users: Sequence[str], inactivity: Inactivity
) -> None:
    """Keep returning readers active as their reads would (a stamp each stamp period), but
    without reads: the phase's period is shorter than a wake, so a reader who stopped would
    go dormant again, and reads through the API would resend the wake (it outlasts twice
    the phase's sweep delay) and time the wake under their load."""
    while True:
        for user in users:
            await repo.stamp_if_old(user, await repo.head(user), inactivity)
        await asyncio.sleep(inactivity.granularity_s / 2)


async def _woken(repo: ActivityRepository, user: str, generation: str, since: float) -> float:
    """Seconds from ``since`` until the marker of the dormancy ``generation`` is gone (the
    wake's end); a marker of another generation means a new dormancy began after it."""
    while (head := await repo.head(user)).dormant and head.generation == generation:
        if time.monotonic() - since > TIMEOUT_S:
            raise TimeoutError(f"{user}'s wake did not end")
        await asyncio.sleep(0.1)
    return time.monotonic() - since


def _check(user: str, ids: list[str], newest: list[str], when: str) -> None:
    """A first page is the newest 250 posts of the 200 followed authors, newest first."""
    if ids != newest:
        missing, extra = len(set(newest) - set(ids)), len(set(ids) - set(newest))
        raise AssertionError(
            f"{user}'s first page {when} is not the newest {len(newest)} posts: {len(ids)} "
            f"items, {missing} missing, {extra} extra"
        )
