"""Backlog: the API and a fresh post while the worker drains thousands of queued backfills.

The same measurements are taken idle and then under the backlog, in one run: the API's write
latency (``POST /users/{id}/posts``), how long a fresh post takes to reach its one follower,
the worker's storage calls that timed out or were throttled, and how fast the backlog
drains (beside the single-write ceiling of the same run)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp

from loadtest.bench.api import ApiProcess
from loadtest.bench.harness import (
    DELIVERIES,
    TEXT,
    WorkerProcess,
    bounded,
    follower_rows,
    fresh_storage,
    total,
    wait_for,
    worker,
    write_rows,
)
from loadtest.bench.measure import delta, quantile
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Followed
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING
from timeline.storage.queue import FanoutQueues
from timeline.tools.azurite import Azurite

UNAVAILABLE = "timeline_storage_unavailable_total"
WRITERS = 4
"""Clients posting at once while the write latency is measured."""


async def backlog(sizes: Sizes, ceiling_single_eps: float) -> dict[str, Any]:
    async with fresh_storage() as (azurites, storage):
        subject = await _seed_backfills(storage, sizes)
        async with _api(azurites) as api, worker(azurites) as process:
            author, reader = await _pair(api)
            idle = await _measure(api, author, reader, sizes.backlog_writes, sizes.backlog_posts)
            before = await process.metrics()
            target = before.get(DELIVERIES, 0) + sizes.backlog_follows * sizes.backlog_subject_posts
            queued = asyncio.create_task(_queue_backfills(storage, subject, sizes))
            await _draining(process, before.get(DELIVERIES, 0))
            busy = await _measure(api, author, reader, sizes.backlog_writes, sizes.backlog_posts)
            left = target - await total([process])
            await queued
            drain_eps = await _drain_rate(process, sizes.backlog_window_s)
            after = await process.metrics()
    return {
        "backlog_follows": sizes.backlog_follows,
        "api_write_p50_ms_idle": idle.write_ms(0.5),
        "api_write_p99_ms_idle": idle.write_ms(0.99),
        "api_write_p50_ms_under_backlog": busy.write_ms(0.5),
        "api_write_p99_ms_under_backlog": busy.write_ms(0.99),
        "api_write_p99_under_backlog_vs_idle": busy.write_ms(0.99) / idle.write_ms(0.99),
        "api_writes_refused_idle": idle.refused,
        "api_writes_refused_under_backlog": busy.refused,
        "fresh_post_visible_s_idle": idle.visible_s(),
        "fresh_post_visible_s_under_backlog": busy.visible_s(),
        "worker_storage_timeouts_under_backlog": delta(before, after, UNAVAILABLE),
        "backlog_copies_left_when_fresh_posts_arrived": left,
        "backlog_drain_eps": drain_eps,
        "backlog_drain_vs_single": drain_eps / ceiling_single_eps,
    }


async def _drain_rate(process: WorkerProcess, window_s: float) -> float:
    """Copies per second over a window of the drain, once every backfill is queued (the
    whole drain takes minutes on Azurite, whose queue slows at depth)."""
    first, started = await total([process]), time.monotonic()
    await asyncio.sleep(window_s)
    return (await total([process]) - first) / (time.monotonic() - started)


async def _seed_backfills(storage: Storage, sizes: Sizes) -> str:
    """A subject with a few posts and every would-be reader already following it."""
    subject = "busy"
    base = now_ticks()
    posts = [
        Post(new_post_id(base + i * 10), subject, TEXT) for i in range(sizes.backlog_subject_posts)
    ]
    await write_rows(storage, POSTS, [p.to_entity(subject) for p in posts], "backlog: posts")
    readers = _readers(sizes)
    await write_rows(
        storage, SUBJECT_FOLLOWERS, follower_rows(subject, readers), "backlog: followers"
    )
    since = datetime.now(UTC)
    following = [{"PartitionKey": r, "RowKey": subject, "since": since} for r in readers]
    await write_rows(storage, SUBJECT_FOLLOWING, following, "backlog: following")
    return subject


def _readers(sizes: Sizes) -> list[str]:
    return [f"b{i:05d}" for i in range(sizes.backlog_follows)]


async def _queue_backfills(storage: Storage, subject: str, sizes: Sizes) -> None:
    queues = FanoutQueues(storage)
    sends = (queues.send(Followed(follower=r, subject=subject)) for r in _readers(sizes))
    await bounded(sends, 32)


@contextlib.asynccontextmanager
async def _api(azurites: list[Azurite]) -> AsyncIterator[ApiProcess]:
    api = ApiProcess(
        azurites,
        TIMELINE_POSTS_PER_MINUTE="0",
        TIMELINE_WRITES_PER_MINUTE="0",
        TIMELINE_REGISTRATIONS_PER_MINUTE="0",
    )
    try:
        await api.ready()
        yield api
    finally:
        await api.stop()


async def _pair(api: ApiProcess) -> tuple[dict[str, str], dict[str, str]]:
    """An author and its one follower, registered and following through the API."""
    users = []
    for name in ("poster", "watcher"):
        async with api.session.post(f"{api.base}/users", json={"user_id": name}) as response:
            users.append({"id": name, "token": (await response.json())["token"]})
    author, reader = users
    url = f"{api.base}/users/{reader['id']}/following/{author['id']}"
    async with api.session.put(url, headers=_auth(reader)):
        pass
    return author, reader


class _Sample:
    def __init__(self) -> None:
        self.writes_ms: list[float] = []
        self.visible: list[float] = []
        self.refused = 0

    def write_ms(self, q: float) -> float:
        return quantile(self.writes_ms, q)

    def visible_s(self) -> float:
        return quantile(self.visible, 0.5)


async def _measure(
    api: ApiProcess, author: dict[str, str], reader: dict[str, str], writes: int, posts: int
) -> _Sample:
    """``writes`` posts by ``WRITERS`` clients at once (their latency), then ``posts`` posts
    one at a time, each timed until it is on the reader's timeline."""
    sample = _Sample()
    await bounded((_timed_post(api, author, sample) for _ in range(writes)), WRITERS)
    for _ in range(posts):
        post_id = await _timed_post(api, author, sample)
        sample.visible.append(await _until_visible(api, reader, post_id))
    return sample


async def _timed_post(api: ApiProcess, author: dict[str, str], sample: _Sample) -> str:
    """One post, timed; a refusal (503 while storage is saturated) is timed and counted too,
    and the post is tried again, as a client would."""
    url = f"{api.base}/users/{author['id']}/posts"
    while True:
        started = time.monotonic()
        try:
            async with api.session.post(url, json={"text": TEXT}, headers=_auth(author)) as r:
                body = await r.json()
        except aiohttp.ClientResponseError:
            sample.refused += 1
            continue
        finally:
            sample.writes_ms.append((time.monotonic() - started) * 1000)
        return str(body["post_id"])


VISIBLE_CAP_S = 60.0
"""A fresh post not on its follower's timeline by then is reported as this (a lower bound):
first in, first out, it would wait for the whole backlog (minutes)."""


async def _until_visible(
    api: ApiProcess, reader: dict[str, str], post_id: str, timeout_s: float = VISIBLE_CAP_S
) -> float:
    started = time.monotonic()
    url = f"{api.base}/users/{reader['id']}/timeline?limit=5"
    while time.monotonic() - started < timeout_s:
        try:
            async with api.session.get(url, headers=_auth(reader)) as response:
                items = (await response.json())["items"]
        except aiohttp.ClientResponseError:
            items = []  # refused while storage is saturated: read again
        if any(item["post_id"] == post_id for item in items):
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    return timeout_s


def _auth(user: dict[str, str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {user['token']}"}


async def _draining(process: WorkerProcess, deliveries: float) -> None:
    """Return once the worker has begun copying backfills."""
    await wait_for(process, DELIVERIES, deliveries + 100, "backlog: starting")
