"""PartitionWriter against a real Azurite: coalescing, linger, full batches, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import eventually, make_settings, unique
from tests.helpers import put_copies
from timeline.delivery.batching.tracker import Tracker
from timeline.delivery.batching.writer import PartitionWriter
from timeline.errors import DeadlineExceededError
from timeline.metrics import WRITE_RETRIES
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


def _posts(count: int) -> list[Post]:
    base = now_ticks()
    return [Post(new_post_id(base + i * 10), "someone", f"#{i}") for i in range(count)]


def _far() -> float:
    """A write deadline no test reaches."""
    return asyncio.get_running_loop().time() + 3600


async def _rows(repos: Repositories, owner: str) -> list[str]:
    return [post.post_id for post in (await repos.timelines.page(owner, 1000, None)).items]


async def test_linger_coalesces_one_partition_into_one_request(
    storage: Storage, repos: Repositories
) -> None:
    owner, other = unique(), unique()
    posts = _posts(3)
    async with PartitionWriter(storage, TIMELINES, linger_s=0.2) as writer:
        tracker = Tracker()
        for post in posts:
            await writer.upsert(owner, post.row_key, post.properties(), tracker, deadline=_far())
        await writer.upsert(
            other, posts[0].row_key, posts[0].properties(), tracker, deadline=_far()
        )
        await asyncio.wait_for(tracker.wait(), 10)  # no flush(): the linger sends them
        assert writer.requests == 2
    assert sorted(await _rows(repos, owner)) == sorted(p.post_id for p in posts)
    assert await _rows(repos, other) == [posts[0].post_id]


async def test_full_partition_goes_out_without_waiting_for_linger(
    storage: Storage, repos: Repositories
) -> None:
    owner = unique()
    async with PartitionWriter(storage, TIMELINES, linger_s=3600) as writer:
        tracker = Tracker()
        for post in _posts(100):
            await writer.upsert(owner, post.row_key, post.properties(), tracker, deadline=_far())
        await asyncio.wait_for(tracker.wait(), 10)
        assert writer.requests == 1
    assert len(await _rows(repos, owner)) == 100


async def test_large_partition_is_split_into_batches_of_100(
    storage: Storage, repos: Repositories
) -> None:
    owner = unique()
    async with PartitionWriter(storage, TIMELINES, linger_s=3600) as writer:
        tracker = Tracker()
        for post in _posts(250):
            await writer.upsert(owner, post.row_key, post.properties(), tracker, deadline=_far())
        await writer.flush()
        await tracker.wait()
        assert writer.requests == 3
    assert len(await _rows(repos, owner)) == 250


async def test_same_row_twice_is_written_once_and_settles_both(
    storage: Storage, repos: Repositories
) -> None:
    owner = unique()
    [post] = _posts(1)
    async with PartitionWriter(storage, TIMELINES, linger_s=3600) as writer:
        first, second = Tracker(), Tracker()
        await writer.upsert(owner, post.row_key, post.properties(), first, deadline=_far())
        await writer.upsert(owner, post.row_key, post.properties(), second, deadline=_far())
        assert writer.buffered == 1
        await writer.flush()
        await first.wait()
        await second.wait()
        assert writer.requests == 1
    assert await _rows(repos, owner) == [post.post_id]


async def test_deletes_of_missing_rows_do_not_fail_the_batch(
    storage: Storage, repos: Repositories
) -> None:
    owner = unique()
    posts = _posts(4)
    await put_copies(storage, owner, posts[:2])
    async with PartitionWriter(storage, TIMELINES, linger_s=3600) as writer:
        tracker = Tracker()
        for post in posts:  # two exist, two never did
            await writer.delete(owner, post.row_key, tracker)
        await writer.flush()
        await tracker.wait()
    assert await _rows(repos, owner) == []


async def test_permanent_failure_reaches_the_tracker(
    durable_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(durable_azurite.connection_string, tmp_path)
    async with (
        Storage(settings.connection_string(), settings.storage_options()) as storage,
        PartitionWriter(storage, TIMELINES, linger_s=0) as writer,
    ):
        await storage.create_all()
        await storage.account_table(0, TIMELINES).delete_table()  # every write now fails
        tracker = Tracker()
        for post in _posts(2):
            await writer.upsert(unique(), post.row_key, post.properties(), tracker, deadline=_far())
        with pytest.raises(Exception, match="TableNotFound"):
            await asyncio.wait_for(tracker.wait(), 10)


@pytest.fixture
def durable_azurite(tmp_path: Path) -> Iterator[Azurite]:
    server = Azurite(location=tmp_path / "azurite")
    server.start()
    yield server
    server.stop()


async def test_batches_are_retried_across_a_storage_outage(
    durable_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(durable_azurite.connection_string, tmp_path, storage_timeout_s=2)
    owner = unique()
    posts = _posts(5)
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        retries_before = WRITE_RETRIES._value.get()
        async with PartitionWriter(storage, TIMELINES, linger_s=3600, max_attempts=8) as writer:
            tracker = Tracker()
            for post in posts:
                await writer.upsert(
                    owner, post.row_key, post.properties(), tracker, deadline=_far()
                )
            await asyncio.to_thread(durable_azurite.stop)
            flushing = asyncio.create_task(writer.flush())

            async def failed_and_retrying() -> bool:
                return bool(WRITE_RETRIES._value.get() > retries_before)

            await eventually(failed_and_retrying, what="the batch to fail and back off")
            await asyncio.to_thread(durable_azurite.start)
            await asyncio.wait_for(flushing, 60)
            await tracker.wait()
        assert WRITE_RETRIES._value.get() > retries_before
        assert sorted(await _rows(Repositories.on(storage), owner)) == sorted(
            p.post_id for p in posts
        )


async def test_tracker_waits_for_writes_added_after_early_ones_committed(
    storage: Storage, repos: Repositories
) -> None:
    """With a small buffer the producer blocks while the first 100 rows commit;
    the tracker must not resolve then, only once every row added before ``wait`` landed."""
    owner = unique()
    posts = _posts(250)
    async with PartitionWriter(storage, TIMELINES, linger_s=3600, max_buffered=100) as writer:
        tracker = Tracker()
        for post in posts:
            await writer.upsert(owner, post.row_key, post.properties(), tracker, deadline=_far())
        flushing = asyncio.create_task(writer.flush())
        await asyncio.wait_for(tracker.wait(), 30)
        assert len(await _rows(repos, owner)) == 250
        await flushing


async def test_upserts_past_their_deadline_are_dropped_and_fail_their_tracker(
    storage: Storage, repos: Repositories
) -> None:
    """A write whose reason was read too long ago is never sent; deletes always are."""
    owner = unique()
    stale, fresh = _posts(2)
    async with PartitionWriter(storage, TIMELINES, linger_s=3600) as writer:
        late, timely = Tracker(), Tracker()
        past = asyncio.get_running_loop().time() - 1
        await writer.upsert(owner, stale.row_key, stale.properties(), late, deadline=past)
        await writer.upsert(owner, fresh.row_key, fresh.properties(), timely, deadline=_far())
        await writer.flush()
        with pytest.raises(DeadlineExceededError):
            await late.wait()
        await timely.wait()
    assert await _rows(repos, owner) == [fresh.post_id]
