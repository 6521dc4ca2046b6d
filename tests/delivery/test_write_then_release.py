"""Write, then release (``timeline.service.outbox``): an API write's message is sent hidden
before the write and made visible after it, so the worker never meets a message before its
fact. A write whose storage calls would pass its deadline is refused and changes nothing;
a message never released shows up by itself once its hidden time ends."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError

from tests.conftest import eventually, make_settings, opened, running_worker, unique
from tests.delivery.helpers import (
    add_posts,
    add_users,
    author_and_reader,
    run_every_pass,
    timeline_ids,
    unlimited_service,
)
from tests.helpers import put_copies, visible_work
from timeline.config import Settings
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import StorageUnavailableError
from timeline.model.messages import FanoutMessage, Followed, Unfollowed, encode
from timeline.service.operations import TimelineService
from timeline.service.outbox import Outbox
from timeline.storage.accounts import Storage
from timeline.storage.flow.guard import deadline
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES
from timeline.storage.queue import FanoutQueue, Reservation
from timeline.tables import counters
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

DEADLINE_S = 0.5
HIDDEN_S = 2
STALE_ETAG = "W/\"datetime'2000-01-01T00%3A00%3A00.0000000Z'\""


class _StallAfterReserve(FanoutQueue):
    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation:
        reservation = await super().reserve(message, hidden_s)
        await asyncio.sleep(2 * DEADLINE_S)  # the request is slow between reserve and write
        return reservation


class _NeverReleased(FanoutQueue):
    """The API process died between the write and the release."""

    async def release(self, reservation: Reservation) -> None:
        return None


class _ReleaseFailsTwice(FanoutQueue):
    """Storage too slow for the first two releases (timed out: nothing changed)."""

    failures = 0

    async def release(self, reservation: Reservation) -> None:
        if self.failures < 2:
            self.failures += 1
            raise StorageUnavailableError("injected: the release timed out", retry_after=1)
        await super().release(reservation)


def _outbox(queue: FanoutQueue) -> Outbox:
    return Outbox(queue, write_deadline_s=DEADLINE_S, hidden_s=HIDDEN_S)


async def _drained(storage: Storage) -> bool:
    return (await FanoutQueue(storage).depth())[0] == 0


async def test_a_follow_past_its_deadline_changes_nothing(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader = unique("author"), unique("reader")
    await add_users(repos, author, reader)
    await add_posts(repos, author, 3)
    service = unlimited_service(storage, outbox=_outbox(_StallAfterReserve(storage)))
    async with running_worker(settings):
        with pytest.raises(StorageUnavailableError):
            await service.follows.follow(reader, reader, author)
        await eventually(lambda: _drained(storage), timeout_s=30, what="queue drained")
    assert not await repos.follows.is_following(reader, author)
    assert await timeline_ids(repos, reader) == []


async def test_an_unfollow_past_its_deadline_changes_nothing(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader, posts = await author_and_reader(repos, 3)
    await put_copies(storage, reader, posts)  # the earlier backfill
    service = unlimited_service(storage, outbox=_outbox(_StallAfterReserve(storage)))
    async with running_worker(settings):
        with pytest.raises(StorageUnavailableError):
            await service.follows.unfollow(reader, reader, author)
        await eventually(lambda: _drained(storage), timeout_s=30, what="queue drained")
    assert await repos.follows.is_following(reader, author)
    assert sorted(await timeline_ids(repos, reader)) == sorted(p.post_id for p in posts)


async def test_a_follow_whose_release_was_lost_is_backfilled_once_its_message_shows(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        repos = Repositories.on(storage)
        author, reader = unique("author"), unique("reader")
        await add_users(repos, author, reader)
        posts = await add_posts(repos, author, 3)
        service = unlimited_service(storage, outbox=_outbox(_NeverReleased(storage)))
        await service.follows.follow(reader, reader, author)
        assert await visible_work(FanoutQueue(storage)) == []  # hidden: never released
        async with running_worker(settings):
            await eventually(
                lambda: _has(repos, reader, len(posts)), timeout_s=30, what="the backfill"
            )
        assert sorted(await timeline_ids(repos, reader)) == sorted(p.post_id for p in posts)


async def _has(repos: Repositories, reader: str, count: int) -> bool:
    return len(await timeline_ids(repos, reader)) == count


async def test_a_reserved_message_is_hidden_until_released(own: Storage) -> None:
    queue = FanoutQueue(own)
    message = Followed(follower=unique("f"), subject=unique("s"))
    reservation = await queue.reserve(message, hidden_s=60)
    assert await visible_work(queue) == []
    await queue.release(reservation)
    [shown] = await visible_work(queue)
    assert shown.id == reservation.message.id
    assert shown.content == encode(message)  # the release left the content as sent
    await queue.release(reservation)  # a retried release (a stale receipt): harmless
    lane = reservation.lane
    [leased] = await lane.receive(1, visibility_timeout_s=30)
    await queue.release(reservation)  # a late release of a leased message: harmless
    assert await visible_work(queue) == []  # and the lease holds
    await lane.delete(leased)


async def _late(service: TimelineService, write: str, author: str, reader: str, post: str) -> None:
    if write == "post":
        await service.posts.create(author, author, "late")
    elif write == "reply":
        await service.posts.create(reader, reader, "late", reply_to=(author, post))
    else:
        await service.reposts.repost(reader, reader, author, post)


@pytest.mark.parametrize("write", ["post", "reply", "repost"])
async def test_a_post_reply_or_repost_past_its_deadline_is_nowhere(
    settings: Settings, storage: Storage, repos: Repositories, write: str
) -> None:
    author, reader, [post] = await author_and_reader(repos, 1)
    service = unlimited_service(storage, outbox=_outbox(_StallAfterReserve(storage)))
    before = await timeline_ids(repos, reader)
    async with running_worker(settings):
        with pytest.raises(StorageUnavailableError):
            await _late(service, write, author, reader, post.post_id)
        await eventually(lambda: _drained(storage), timeout_s=30, what="queue drained")
    assert [p.post_id for p in (await repos.posts.page(author, 10, None)).items] == [post.post_id]
    assert (await repos.posts.page(reader, 10, None)).items == []
    assert await repos.reposts.live_id(reader, post.post_id) is None
    assert await timeline_ids(repos, reader) == before


async def test_the_deadline_cuts_a_contended_counters_retries(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every counted transaction meets a changed counter shard (as under a follow storm,
    here a stale ETag): the counter's own retry budget is 3 storage timeouts, but no call
    leaves past the write's deadline, so nothing lands after it."""
    follower, subject = unique("f"), unique("s")
    for shard in range(counters.SHARDS):  # every shard exists, so each change is an update
        await storage.table(SUBJECT_FOLLOWERS, subject).upsert_entity(
            {"PartitionKey": subject, "RowKey": counters.shard_key(shard), "n": 0}
        )
    attempts: list[float] = []
    read_shard = counters._shard_operation

    async def stale(*args: Any) -> Any:
        leaves = time.monotonic()  # a read that leaves in time may end after the deadline
        operation = await read_shard(*args)  # (one that would leave later is refused)
        attempts.append(leaves)
        return (*operation[:2], {**operation[2], "etag": STALE_ETAG})

    monkeypatch.setattr(counters, "_shard_operation", stale)
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError), deadline(started + DEADLINE_S):
        await repos.follows.add(follower, subject, datetime.now(UTC))
    assert len(attempts) > 1, "the conflict was retried"
    assert max(attempts) <= started + DEADLINE_S
    assert not await repos.follows.is_following(follower, subject)


async def test_an_unfollow_never_made_leaves_the_live_copies_and_drops_a_deleted_posts(
    storage: Storage, repos: Repositories
) -> None:
    """An unfollow refused past its deadline shows its message at the hidden time, the pair
    still followed; meanwhile a post was deleted while the reader was out of its delete's
    reach. The unfollow's passes reconcile: live copies stay, the deleted post's goes."""
    author, reader, posts = await author_and_reader(repos, 2)
    await put_copies(storage, reader, posts)
    gone = posts[0]
    assert await repos.posts.delete(author, gone.post_id)  # its delete skipped the reader
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await run_every_pass(worker, Unfollowed(follower=reader, subject=author))
    assert await repos.follows.is_following(reader, author)
    assert await timeline_ids(repos, reader) == [posts[1].post_id]


async def test_a_release_that_fails_is_tried_again_before_the_hidden_time(own: Storage) -> None:
    queue = _ReleaseFailsTwice(own)
    service = unlimited_service(own, outbox=Outbox(queue, hidden_s=600))
    author, reader = unique("author"), unique("reader")
    await add_users(Repositories.on(own), author, reader)
    await service.follows.follow(reader, reader, author)

    async def shown() -> bool:
        return len(await visible_work(FanoutQueue(own))) == 1

    await eventually(shown, timeout_s=10, what="the message, released on a later try")
    assert queue.failures == 2


class _ReleaseHangs(FanoutQueue):
    """Storage stalled for every release."""

    async def release(self, reservation: Reservation) -> None:
        await asyncio.Event().wait()


async def test_a_stopping_api_waits_for_releases_only_so_long(own: Storage) -> None:
    outbox = Outbox(_ReleaseHangs(own), hidden_s=600)
    async with outbox.written(Followed(follower=unique("f"), subject=unique("s"))):
        pass
    started = time.monotonic()
    await outbox.drain(within_s=0.2)  # the message shows when hidden time ends
    assert time.monotonic() - started < 2


async def test_a_release_refused_for_another_reason_than_a_stale_receipt_is_an_error(
    own: Storage,
) -> None:
    queue = FanoutQueue(own)
    reservation = await queue.reserve(Followed(follower=unique("f"), subject=unique("s")), 60)
    lane = reservation.lane
    await lane._queue.delete_queue()  # say, a queue removed by hand: not a harmless retry
    with pytest.raises(HttpResponseError) as raised:
        await queue.release(reservation)
    assert getattr(raised.value, "error_code", None) == "QueueNotFound"
