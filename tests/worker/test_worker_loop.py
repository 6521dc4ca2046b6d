"""Worker behaviour that needs a queue of its own: each test gets a private Azurite."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import Counter

from fanout_worker.worker import Worker
from tests.conftest import eventually, make_settings, program_env, running_worker
from tests.helpers import visible_work
from tests.worker.helpers import author_with_followers, timeline_ids
from timeline.config import Settings
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.metrics import DELIVERIES, STORAGE_UNAVAILABLE
from timeline.model.messages import PostCreated, PostDeleted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

SLOW_WRITES = {"worker_write_deadline_s": 60.0, "worker_sweep_delay_s": 70.0}
"""For tests that push thousands of writes through one or a few request slots on a busy
machine: a page must fit its write deadline (the sweeps are not what they test)."""


@contextlib.asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[Storage]:
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        yield storage


async def _counter_above(counter: Counter, value: float) -> bool:
    return bool(counter._value.get() > value)


async def test_message_failing_too_often_is_poisoned(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        worker_visibility_timeout_s=1,
        worker_max_deliveries=2,
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, 2)
        await storage.table(TIMELINES, author).delete_table()  # every delivery now fails
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        async with running_worker(settings):

            async def poisoned() -> bool:
                return len(await queue.peek_poison()) == 1

            await eventually(poisoned, timeout_s=30, what="the failing message in poison")
        [parked] = await queue.peek_poison()
        assert parked.reason.startswith("failed: 2 failures: ResourceNotFoundError")
        assert author in parked.content
        assert parked.dequeue_count == 2
        assert (await queue.depth())[0] == 0


async def test_poisoned_message_can_be_requeued(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send_raw("not json")
        async with running_worker(settings):
            await eventually(
                lambda: _poison_depth_is(queue, 1), what="the malformed message in poison"
            )
        assert await queue.requeue_poison() == 1
        assert await queue.depth() == (1, 0)


async def _poison_depth_is(queue: FanoutQueue, expected: int) -> bool:
    return (await queue.depth())[1] == expected


async def test_lease_is_renewed_for_long_work(private_azurite: Azurite, tmp_path: Path) -> None:
    """A fan-out that outlives the visibility timeout is not handed to a second worker."""
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        worker_visibility_timeout_s=1,
        worker_write_concurrency=1,
        worker_max_deliveries=1,
        **SLOW_WRITES,
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, 2000)
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        async with running_worker(settings), running_worker(settings):
            await eventually(lambda: _work_depth_is(queue, 0), timeout_s=60, what="fan-out done")
        assert (await queue.depth()) == (0, 0), "a redelivery would have exceeded max deliveries"


async def _work_depth_is(queue: FanoutQueue, expected: int) -> bool:
    return (await queue.depth())[0] == expected


async def test_stop_drains_in_flight_messages(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, 200)
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        async with running_worker(settings):
            await eventually(lambda: _in_flight(queue), what="the message being leased")
            await asyncio.sleep(0.05)
        # stopped: the in-flight fan-out was finished and deleted, not abandoned
        assert (await queue.depth()) == (0, 0)
        followers = [
            edge.user_id for edge in (await repos.follows.followers_page(author, 1000, None)).items
        ]
        for follower in followers:
            page = await repos.timelines.page(follower, 10, None)
            assert [p.post_id for p in page.items] == [post.post_id]


async def _in_flight(queue: FanoutQueue) -> bool:
    """The message is leased: counted in the queue but not visible to a peek."""
    work, _ = await queue.depth()
    return work == 1 and not await visible_work(queue)


async def test_huge_fan_out_is_split_into_continuation_messages(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(
        private_azurite.connection_string, tmp_path, worker_follower_page_size=50
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, 230)
        followers = [f"f{i:05d}" for i in range(230)]
        message = PostCreated(author=author, post_id=post.post_id)

        async with PartitionWriter(storage, TIMELINES) as writer:
            processor = FanoutProcessor.on(storage, writer, follower_page_size=50)
            first = await processor.handle(message)
            again = await processor.handle(message)  # a redelivery of the same page
        # one message did one page of work and asks to be rewritten for the next page;
        # doing the page again asks for the same next page and queues nothing (no fork)
        delivered = [f for f in followers if await timeline_ids(repos, f)]
        assert delivered == followers[:50]
        assert await timeline_ids(repos, author) == [post.post_id]
        assert isinstance(first, Continue)
        assert first == again
        assert isinstance(first.message, PostCreated)
        assert first.message.cursor is not None
        assert first.message.post_id == post.post_id
        assert await queue.depth() == (0, 0)

        await queue.send(message)
        async with running_worker(settings), running_worker(settings):
            await eventually(
                lambda: _work_depth_is(queue, 0), timeout_s=60, what="the chunked fan-out"
            )
        for follower in followers:
            assert await timeline_ids(repos, follower) == [post.post_id]

        await queue.send(PostDeleted(author=author, post_id=post.post_id))
        async with running_worker(settings), running_worker(settings):
            await eventually(
                lambda: _work_depth_is(queue, 0), timeout_s=60, what="the chunked delete"
            )
        for owner in [author, *followers]:
            assert await timeline_ids(repos, owner) == []
        assert await repos.posts.get(author, post.post_id) is None
        assert (await queue.depth())[1] == 0


@pytest.mark.parametrize("followers", [pytest.param(3000, marks=pytest.mark.long), 300])
async def test_worker_survives_storage_outage_and_stops_in_bounded_time(
    tmp_path: Path, followers: int
) -> None:
    azurite = Azurite(location=tmp_path / "azurite")
    azurite.start()
    settings = make_settings(
        azurite.connection_string,
        tmp_path,
        storage_timeout_s=2,
        worker_visibility_timeout_s=5,
        worker_shutdown_grace_s=3,
        worker_write_concurrency=4,
        **SLOW_WRITES,
    )
    try:
        async with opened(settings) as storage:
            repos, queue = Repositories.on(storage), FanoutQueue(storage)
            author, post = await author_with_followers(storage, repos, followers)
            await asyncio.to_thread(azurite.stop)  # SIGTERM: Azurite writes the seed to disk
            await asyncio.to_thread(azurite.start)
            worker = Worker(settings, settings.connection_string())
            running = asyncio.create_task(worker.async_run())
            delivered = DELIVERIES._value.get()
            await queue.send(PostCreated(author=author, post_id=post.post_id))
            await eventually(lambda: _counter_above(DELIVERIES, delivered), what="mid fan-out")
            await asyncio.to_thread(azurite.stop)
            unavailable = STORAGE_UNAVAILABLE._value.get()
            await eventually(  # the worker keeps failing, backing off, not dying
                lambda: _counter_above(STORAGE_UNAVAILABLE, unavailable + 2),
                what="the worker to meet the outage more than once",
            )
            assert not running.done()
            await asyncio.to_thread(azurite.start)

            async def everyone_has_it() -> bool:
                for i in range(0, followers, 97):
                    if await timeline_ids(repos, f"f{i:05d}") != [post.post_id]:
                        return False
                return (await queue.depth())[0] == 0

            await eventually(everyone_has_it, timeout_s=90, what="recovery after the outage")
            for i in range(followers):
                assert await timeline_ids(repos, f"f{i:05d}") == [post.post_id]

            await asyncio.to_thread(azurite.stop)
            worker.stop()  # storage is down again: stopping must not wait for it
            await asyncio.wait_for(running, 30)
    finally:
        azurite.stop()


async def test_stop_is_bounded_while_storage_is_down(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    """Buffered writes that cannot be written are dropped at the deadline, not retried for
    minutes: their message was never deleted, so it is redelivered later."""
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        storage_timeout_s=2,
        worker_shutdown_grace_s=2,
        worker_write_concurrency=2,
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, 5000)
        await queue.send(PostCreated(author=author, post_id=post.post_id))
    worker = Worker(settings, settings.connection_string())
    written = DELIVERIES._value.get()
    running = asyncio.create_task(worker.async_run())
    try:
        await eventually(  # the first writes landed: thousands more wait behind 2 request slots
            lambda: _counter_above(DELIVERIES, written), what="the fan-out writing"
        )
        private_azurite.signal(signal.SIGKILL)  # as a crash would
        await asyncio.to_thread(private_azurite.stop)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)


@pytest.mark.parametrize("count", [pytest.param(2500, marks=pytest.mark.long), 600])
async def test_worker_killed_mid_fan_out_is_taken_over(
    private_azurite: Azurite, tmp_path: Path, count: int
) -> None:
    """SIGKILL a worker process mid fan-out; once its lease runs out another worker takes
    the message over and every follower ends with the post exactly once."""
    settings = make_settings(
        private_azurite.connection_string, tmp_path, worker_visibility_timeout_s=4
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, count)
        followers = [f"f{i:05d}" for i in range(count)]
        env = program_env(
            storage_connection_string=private_azurite.connection_string,
            data_dir=tmp_path,
            worker_visibility_timeout_s=4,
            worker_write_concurrency=2,
            worker_idle_sleep_s=0.05,
            worker_idle_max_sleep_s=0.05,
        )
        victim = subprocess.Popen(  # noqa: ASYNC220 - the worker under test
            [sys.executable, "-m", "fanout_worker"], env=env, stderr=subprocess.DEVNULL
        )
        try:
            await queue.send(PostCreated(author=author, post_id=post.post_id))

            async def started() -> bool:
                return bool(await timeline_ids(repos, followers[0]))

            await eventually(started, timeout_s=30, what="the first deliveries")
        finally:
            victim.kill()
            await asyncio.to_thread(victim.wait)
        delivered = [f for f in followers[::50] if await timeline_ids(repos, f)]
        assert len(delivered) < len(followers[::50]), "killed too late to prove a takeover"

        async with running_worker(settings):
            await eventually(lambda: _work_depth_is(queue, 0), timeout_s=90, what="takeover")
        for follower in followers:
            assert await timeline_ids(repos, follower) == [post.post_id]
        assert await timeline_ids(repos, author) == [post.post_id]
        assert (await queue.depth()) == (0, 0)
