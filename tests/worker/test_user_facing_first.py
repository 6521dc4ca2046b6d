"""User-facing work goes before background work: a fresh post overtakes a deep backlog.

A real worker process drains queued backfills (1,000; 5,000 in ``make test-long``) on a real
Azurite while an author posts through the API: the post must reach its follower while most
of the backlog is still queued (first in, first out it would wait for all of it), and the
API keeps answering."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

import timeline.storage.queue as queue_module
from tests.conftest import (
    api_client,
    eventually,
    make_settings,
    opened,
    program_env,
    running_worker,
    unique,
)
from timeline.config import Settings
from timeline.errors import StorageUnavailableError
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import (
    FanoutMessage,
    Followed,
    PostCreated,
    PostDeleted,
    Regrade,
    Reposted,
    Unfollowed,
    urgency,
)
from timeline.model.priority import Priority
from timeline.storage.accounts import Storage
from timeline.storage.calls import chunked, submit_batch
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS
from timeline.storage.queue import FanoutQueue, Lane
from timeline.tools.azurite import Azurite, free_ports

BACKFILLS = [pytest.param(5000, marks=pytest.mark.long), 1000]
READERS = ["reader0", "reader1", "reader2"]
CURSOR = {"PartitionKey": "a", "RowKey": "b"}


def test_what_a_user_waits_for_is_urgent_and_the_rest_is_background() -> None:
    post, ids = new_post_id(now_ticks()), {"author": "a"}
    repost = {"reposter": "r", "repost_id": new_post_id(now_ticks())}
    user_facing: list[FanoutMessage] = [
        PostCreated(post_id=post, **ids),
        PostCreated(post_id=post, cursor=CURSOR, **ids),  # every page: a follower waits on it
        PostCreated(post_id=post, cursor=CURSOR, merged=True, **ids),
        Reposted(post_id=post, **ids, **repost),
        Reposted(post_id=post, cursor=CURSOR, **ids, **repost),
        PostDeleted(post_id=post, **ids),
        Unfollowed(follower="f", subject="s"),
    ]
    assert {urgency(message) for message in user_facing} == {Priority.HIGH}
    background: list[FanoutMessage] = [
        PostCreated(post_id=post, background=True, **ids),
        PostDeleted(post_id=post, cursor=CURSOR, **ids),
        PostDeleted(post_id=post, confirm=True, **ids),
        Unfollowed(follower="f", subject="s", confirm=True),
        Followed(follower="f", subject="s"),
        Regrade(author="a", merge=True, token="0" * 32),
    ]
    assert {urgency(message) for message in background} == {Priority.LOW}


async def _seed_backlog(storage: Storage, queue: FanoutQueue, backfills: int) -> None:
    """A subject with a few posts, ``backfills`` followers, and a backfill queued for each."""
    subject, since = "busy", datetime.now(UTC)
    posts = [Post(new_post_id(now_ticks() + i), subject, "old news") for i in range(5)]
    await submit_batch(storage, POSTS, subject, [("upsert", p.to_entity(subject)) for p in posts])
    readers = [f"r{i:05d}" for i in range(backfills)]
    for chunk in chunked([{"PartitionKey": subject, "RowKey": r, "since": since} for r in readers]):
        await submit_batch(storage, SUBJECT_FOLLOWERS, subject, [("upsert", e) for e in chunk])
    semaphore = asyncio.Semaphore(32)

    async def send(reader: str) -> None:
        async with semaphore:
            await queue.send(Followed(follower=reader, subject=subject))

    await asyncio.gather(*(send(reader) for reader in readers))


@contextlib.asynccontextmanager
async def _worker_process(settings: Settings, log: Path) -> AsyncIterator[str]:
    """A worker process; yields its ``/metrics`` URL."""
    metrics_port = free_ports(1)[0]
    env = program_env(
        storage_connection_string=settings.connection_string(),
        data_dir=settings.data_dir,
        auth_secret=settings.auth_secret,
        worker_idle_sleep_s=0.05,
        worker_idle_max_sleep_s=0.05,
        worker_metrics_port=metrics_port,
        worker_follower_page_size=1,
    )
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fanout_worker", env=env, stdout=sink, stderr=sink
        )
    try:
        yield f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 60)


async def _backfills_done(client: TestClient[Any, Any], metrics: str) -> float:
    """Backfills the worker process has completed, read from its ``/metrics`` (0 before it
    serves them): observing it costs the storage under test nothing."""
    try:
        async with client.session.get(metrics) as response:
            text = await response.text()
    except aiohttp.ClientError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "fanout_messages_total"
        and sample.labels == {"type": "follow", "outcome": "done"}
    )


async def _post_ten(
    client: TestClient[Any, Any], user: str, headers: dict[str, str]
) -> tuple[float, str]:
    """Ten posts by ``user`` through the API: the slowest answer's seconds and the last
    post's id."""
    slowest, post_id = 0.0, ""
    for _ in range(10):
        started = time.monotonic()
        path, body = f"/users/{user}/posts", {"text": "fresh"}
        response = await client.post(path, json=body, headers=headers)
        slowest = max(slowest, time.monotonic() - started)
        assert response.status == 202
        post_id = (await response.json())["post_id"]
    return slowest, post_id


async def _register(client: TestClient[Any, Any], user: str) -> dict[str, str]:
    response = await client.post("/users", json={"user_id": user})
    assert response.status == 201
    return {"Authorization": f"Bearer {(await response.json())['token']}"}


@pytest.mark.parametrize("backfills", BACKFILLS)
async def test_a_fresh_post_overtakes_a_backlog_of_backfills(
    private_azurite: Azurite, tmp_path: Path, backfills: int
) -> None:
    """The author's followers span several fan-out pages (one follower a page here): every
    page is user-facing, so each follower has the post while most backfills still wait."""
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage, api_client(settings) as client:
        queue = FanoutQueue(storage)
        await _seed_backlog(storage, queue, backfills)
        author = await _register(client, "author")
        readers = {name: await _register(client, name) for name in READERS}
        for name, reader in readers.items():
            response = await client.put(f"/users/{name}/following/author", headers=reader)
            assert response.status == 204
        async with _worker_process(settings, tmp_path / "worker.log") as metrics:

            async def backfilling() -> bool:
                return await _backfills_done(client, metrics) > 0

            await eventually(backfilling, timeout_s=60, what="the worker to start the backlog")
            slowest, post_id = await _post_ten(client, "author", author)

            async def delivered() -> bool:
                for name, reader in readers.items():
                    page = await client.get(f"/users/{name}/timeline?limit=20", headers=reader)
                    if page.status != 200:  # the reader, not what is measured: ask again
                        return False
                    if post_id not in [item["post_id"] for item in (await page.json())["items"]]:
                        return False
                return True

            await eventually(delivered, timeout_s=15, what="the fresh post to reach every reader")
            left = await queue.lanes[Priority.LOW].depth()
    print(f"\nbackfills still queued when the post arrived: {left}; slowest write {slowest:.2f}s")
    assert left > backfills // 2, "the post waited for the backlog"
    assert slowest < 3.0, "the API kept answering writes while the worker drained"


class _DeleteFailsOnce(Lane):
    """The queue answers 503 to the first delete, as a busy account may."""

    failed = False

    async def delete(self, message: Any) -> None:
        if not _DeleteFailsOnce.failed:
            _DeleteFailsOnce.failed = True
            raise StorageUnavailableError("injected 503 on delete_message", retry_after=1)
        await super().delete(message)


async def test_a_step_moved_to_the_background_is_sent_once_when_the_delete_is_retried(
    private_azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete's first pass moves its second pass to the background queue (send, then
    delete the original); a delete that fails and is retried must not send it again."""
    monkeypatch.setattr(queue_module, "Lane", _DeleteFailsOnce)
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(PostDeleted(author=unique("a"), post_id=new_post_id(now_ticks())))
        async with running_worker(settings):

            async def moved() -> bool:
                return await queue.lanes[Priority.HIGH].depth() == 0

            await eventually(moved, timeout_s=30, what="the first pass to be settled")
        assert _DeleteFailsOnce.failed
        assert await queue.lanes[Priority.LOW].depth() == 1  # the second pass, once
