"""Every auxiliary row ends: idempotency keys and rate-limit windows are filed in ``expiries``
and removed by the worker's sweep once they can no longer matter, judged from storage; live
rows stay, and follow changes leave nothing but the live follows and their counters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import pytest

from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import AzuritePool, azurites, storage_on, unique
from timeline.model.entities import Post, User
from timeline.model.idempotency import IdempotencyKeys
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.storage.names import EXPIRIES, POSTS, RATE_LIMITS, SUBJECT_FOLLOWERS
from timeline.storage.placement import hash64
from timeline.storage.queue import FanoutQueue
from timeline.storage.rebalance import Rebalancer
from timeline.tables.expiries import IDEMPOTENCY, ExpiriesRepository, index_row_key
from timeline.tables.follows import LEFT_PREFIX
from timeline.tables.posts import KEY_ROWS
from timeline.tables.ratelimits import RateLimits, TableWindowStorage, partition_of
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity
from timeline.tools.azurite import Azurite

TOGGLES = [pytest.param(50, 100, marks=[pytest.mark.long, pytest.mark.timeout(600)]), (10, 20)]
"""Followers toggling so many times each, half then following again: 10,025 requests in
``make test-long``, 405 in ``make test``."""
LATER = 3600 + GRACE_S + 120
"""A sweep this far in the future finds every row filed now (due within the hour) due."""


@pytest.fixture(scope="module")
def own_azurite(azurite_pool: AzuritePool) -> Iterator[Azurite]:
    """This module's own account: its sweeps (run as if hours later) touch only its rows."""
    with azurites(azurite_pool, 1) as (server,):
        yield server


@pytest.fixture(scope="module")
async def own(own_azurite: Azurite) -> AsyncIterator[Storage]:
    async with storage_on([own_azurite]) as storage:
        await storage.create_all()
        yield storage


def _sweeper(storage: Storage) -> Sweeper:
    return Sweeper(storage)


async def _rows(
    storage: Storage, table: str, partition: str | None = None, *, key: str = "RowKey"
) -> list[str]:
    """Every row's ``key`` (its row key) in a table (of one partition), on every account."""
    keys: list[str] = []
    for account in range(len(storage.account_ids)):
        client = storage.account_table(account, table)
        async with storage.guard():
            if partition is None:
                keys += [row[key] async for row in client.list_entities()]
            else:
                rows = client.query_entities("PartitionKey eq @pk", parameters={"pk": partition})
                keys += [row[key] async for row in rows]
    return keys


def _service(storage: Storage, writes_per_minute: int) -> TimelineService:
    return TimelineService(
        Repositories.on(storage),
        FanoutQueue(storage),
        TokenSigner(b"test", token_ttl_s=3600),
        page_size=250,
        max_post_chars=280,
        limits=RateLimits.per_minute(storage, posts=0, writes=writes_per_minute, registrations=0),
        home=HomeTimeline(storage, max_merged=20),
    )


async def _register(repos: Repositories, *names: str) -> None:
    for name in names:
        await repos.users.create(User(name, name, datetime.now(UTC)))


@pytest.mark.parametrize(("followers_count", "pairs_each"), TOGGLES)
async def test_many_follow_requests_leave_only_live_rows_after_a_sweep(
    own: Storage, followers_count: int, pairs_each: int
) -> None:
    """50 followers toggle one subject 100 times each, half then follow once more (10,025
    requests' writes; 405 in the quick twin), each write as the API makes it (the follow
    change and its counter shard in one transaction): after a sweep, exactly the live
    follows and counters are left, and no index row. (The service's own reads and queue
    sends are left out to keep this within minutes on two cores;
    ``test_requests_through_the_service_end_the_same`` drives the same through
    ``TimelineService``.)"""
    repos = Repositories.on(own)
    follows = repos.follows
    subject, followers = unique("s"), [unique("f") for _ in range(followers_count)]

    async def toggle(follower: str, index: int) -> None:
        for _ in range(pairs_each):
            now = datetime.now(UTC)
            assert await follows.add(follower, subject, now)
            assert await follows.remove(follower, subject)
        if index % 2 == 0:
            await follows.add(follower, subject, datetime.now(UTC))

    started = time.monotonic()
    await asyncio.gather(*(toggle(f, i) for i, f in enumerate(followers)))
    requests_s = time.monotonic() - started
    requests = 2 * followers_count * pairs_each + (followers_count + 1) // 2

    started = time.monotonic()
    report = await _sweeper(own).sweep(now=time.time() + LATER)
    sweep_s = time.monotonic() - started
    print(f"\n{requests} requests: {requests_s:.1f} s; sweep: {sweep_s:.1f} s, {report}")
    await _assert_only_live(own, subject, [f for i, f in enumerate(followers) if i % 2 == 0])


async def test_requests_through_the_service_end_the_same(own: Storage) -> None:
    """Follow and unfollow requests through ``TimelineService`` (rate-limited in storage):
    after a sweep, only the live follows are left (and a ``~unfollowed-`` row per pair ever
    unfollowed), and no index row or window."""
    service = _service(own, writes_per_minute=1_000_000)
    subject, followers = unique("s"), [unique("f") for _ in range(10)]
    await _register(Repositories.on(own), subject, *followers)

    async def toggle(follower: str, index: int) -> None:
        for _ in range(10):
            await service.follows.follow(follower, follower, subject)
            await service.follows.unfollow(follower, follower, subject)
        if index % 2 == 0:
            await service.follows.follow(follower, follower, subject)

    windows_before = set(await _rows(own, RATE_LIMITS, key="PartitionKey"))
    await asyncio.gather(*(toggle(f, i) for i, f in enumerate(followers)))
    ours = set(await _rows(own, RATE_LIMITS, key="PartitionKey")) - windows_before
    assert len(ours) == len(followers)  # one window per follower's write limit
    await _sweeper(own).sweep(now=time.time() + LATER)
    live = [f for i, f in enumerate(followers) if i % 2 == 0]
    await _assert_only_live(own, subject, live, unfollowed=followers)
    assert not ours & set(await _rows(own, RATE_LIMITS, key="PartitionKey"))


async def _assert_only_live(
    storage: Storage, subject: str, live: list[str], unfollowed: list[str] | None = None
) -> None:
    """Only the live follows, the counter rows, and one ``~unfollowed-`` row per pair ever
    unfollowed (``unfollowed``), however many times it was."""
    rows = await _rows(storage, SUBJECT_FOLLOWERS, subject)
    assert sorted(k for k in rows if not k.startswith("~")) == sorted(live)
    ended = sorted(k.removeprefix(LEFT_PREFIX) for k in rows if k.startswith(LEFT_PREFIX))
    assert ended == sorted(unfollowed or [])
    auxiliary = [k for k in rows if k.startswith("~")]
    assert [k for k in auxiliary if not k.startswith(("~count-", LEFT_PREFIX))] == []
    assert await Repositories.on(storage).follows.follower_count(subject) == len(live)
    assert subject not in await _rows(storage, EXPIRIES, key="pk")  # no index row names it


async def test_an_idempotency_key_ends_with_its_window_unless_reused(own: Storage) -> None:
    """A key's row goes once its record has expired; a key used again after expiry has a
    new row with a new expiry, which the old index row's sweep leaves alone."""
    repos = Repositories.on(own)
    keys = IdempotencyKeys(b"k" * 32, window_s=600)
    author = unique("a")
    first = keys.record("once", [author, "x"])
    await repos.posts.add(Post(post_id=new_post_id(now_ticks()), author=author, text="x"), first)
    reused_early = keys.record("again", [author, "y"], now=time.time() - 600)
    await repos.posts.add(
        Post(post_id=new_post_id(now_ticks()), author=author, text="y"), reused_early
    )
    reused = keys.record("again", [author, "y"], now=time.time() + 3 * 3600)
    assert await repos.posts.by_key(author, reused) is None  # expired: removed, key free
    await repos.posts.add(Post(post_id=new_post_id(now_ticks()), author=author, text="y"), reused)

    await _sweeper(own).sweep(now=time.time() + 600 + GRACE_S + 120)
    assert not await _row(own, POSTS, author, f"{KEY_ROWS}{first.key}")
    assert await _row(own, POSTS, author, f"{KEY_ROWS}{reused.key}")  # live: kept
    assert await repos.posts.by_key(author, reused) is not None
    await _sweeper(own).sweep(now=time.time() + 3 * 3600 + LATER)
    assert not await _row(own, POSTS, author, f"{KEY_ROWS}{reused.key}")


async def test_a_rate_limit_window_ends_unless_reopened(own: Storage) -> None:
    windows = TableWindowStorage(own)
    ended, reopened = unique("k"), unique("k")
    await windows.incr(ended, 60)
    await windows.incr(reopened, 60)
    await windows.clear(reopened)
    await windows.incr(reopened, 6 * 3600)  # a new window since, far from its end
    await _sweeper(own).sweep(now=time.time() + 60 + GRACE_S + 120)
    assert not await _row(own, RATE_LIMITS, partition_of(ended), "window")
    assert await windows.get(reopened) == 1


async def test_an_index_row_naming_nothing_is_dropped(own: Storage) -> None:
    """A process died between filing a key row and writing it: the sweep drops the index row."""
    author = unique("a")
    await ExpiriesRepository(own).note(IDEMPOTENCY, POSTS, author, f"{KEY_ROWS}x", at=time.time())
    index = index_row_key(POSTS, author, f"{KEY_ROWS}x")
    assert index in await _rows(own, EXPIRIES)
    await _sweeper(own).sweep(now=time.time() + LATER)
    assert index not in await _rows(own, EXPIRIES)


async def test_two_sweepers_at_once_leave_the_same_end(own: Storage) -> None:
    windows = TableWindowStorage(own)
    keys = [unique("k") for _ in range(40)]
    await asyncio.gather(*(windows.incr(key, 60) for key in keys))
    later = time.time() + LATER
    await asyncio.gather(_sweeper(own).sweep(now=later), _sweeper(own).sweep(now=later))
    for key in keys:
        assert not await _row(own, RATE_LIMITS, partition_of(key), "window")
    filed = {index_row_key(RATE_LIMITS, partition_of(key), "window") for key in keys}
    assert not filed & set(await _rows(own, EXPIRIES))


async def test_rows_on_every_account_are_swept(two_azurites: list[Azurite]) -> None:
    """Index rows and the rows they name are spread over the accounts by placement; one
    sweep finds each on its home."""
    async with storage_on(two_azurites) as storage:
        await storage.create_all()
        windows = TableWindowStorage(storage)
        keys = [unique("k") for _ in range(12)]
        for key in keys:
            await windows.incr(key, 60)
        homes = {storage.placement.home(hash64(partition_of(key))) for key in keys}
        assert homes == {0, 1}
        assert len(await _rows(storage, EXPIRIES)) == len(keys)
        await _sweeper(storage).sweep(now=time.time() + LATER)
        assert await _rows(storage, RATE_LIMITS) == []
        assert await _rows(storage, EXPIRIES) == []


async def _row(storage: Storage, table: str, partition: str, row: str) -> bool:
    return await get_entity(storage, table, partition, row) is not None


async def test_a_rebalance_neither_resurrects_nor_orphans(two_azurites: list[Azurite]) -> None:
    """Rate-limit windows and their index rows on one account; a second account is added.
    A sweep while the rebalance has slots frozen removes what is not moving and leaves what
    is (a delete there would be lost to the copy, or land on a partition being copied); once
    the rebalance is done, a sweep removes the rest: no row and no index row is left on
    either account."""
    keys = [unique("k") for _ in range(40)]
    async with storage_on(two_azurites[:1]) as storage:
        await storage.create_all()
        windows = TableWindowStorage(storage)
        for key in keys:
            await windows.incr(key, 60)
    deferred: list[int] = []
    later = time.time() + LATER

    async with storage_on(two_azurites) as storage:

        async def sweep_while_frozen(_seconds: float) -> None:
            if not deferred:
                await storage.refresh_placement()
                deferred.append((await _sweeper(storage).sweep(now=later)).deferred)

        await Rebalancer(
            storage, margin_s=0, steps=3, progress=False, sleep=sweep_while_frozen
        ).run()
        assert deferred[0] > 0, "some windows were in frozen, moving partitions"
        left = [k for k in keys if await _rows(storage, RATE_LIMITS, partition_of(k))]
        assert 0 < len(left) <= deferred[0]  # a frozen window, or a frozen index row, waits
        placement = await storage.refresh_placement()  # the next round reads it settled
        assert placement is not None
        assert placement.settled
        await _sweeper(storage).sweep(now=later)
        for account in range(2):
            for table in (RATE_LIMITS, EXPIRIES):
                client = storage.account_table(account, table)
                async with storage.guard():
                    assert [row async for row in client.list_entities()] == [], (account, table)
