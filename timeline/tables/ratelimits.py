"""Per-key rate limits for every mutating route, counted in storage so they hold across
every API process and host.

Each limiter key (``posts``, ``writes`` or ``registrations`` plus a user id or a client
address) has one row in the ``rateLimits`` table: ``count`` hits in a fixed window that ends
at ``expires_at`` (Unix seconds), the window starting with the key's first hit after the
previous one ended. The algorithm is the ``limits`` library's fixed window; this module only
gives it a storage backend (``TableWindowStorage``).

**Cost.** A limit of 0 makes no storage calls. Otherwise a check that passes is two storage
requests (read the row, then replace it on the condition that its ETag is unchanged, or
create it), three when it opens a window (its filing in ``expiries``); a check that is
refused is three (the same two, then one read of the window's end for ``Retry-After``). Each
lost race (another process counted the same key between the read and the write) costs two
more, with a short jittered pause, so n concurrent hits on one key cost O(n^2) requests at
worst (20 at once on Azurite: about 170 requests, 0.75 s); a request gives up after
``ETAG_ATTEMPTS`` rounds with a retryable 503. Different keys never contend: each key is its own
partition, spread over the storage accounts like any other.

**Why fixed windows are acceptable.** A fixed window lets a client make up to twice the limit
in a short span across the end of one window and the start of the next, where a moving
window would not. These limits protect the service from runaway clients, not billing
quotas, so a bounded 2x burst is fine; in exchange a check is one row and two requests,
where a moving window would store a row per hit. The window's end is written with the clock
of the process that opened it, so clock skew between hosts (normally well under a second)
only moves window edges by that much. A row is reused when its window has ended; each
window opened is filed in ``expiries`` (one more write per window, not per hit), and the
worker's sweep deletes the row once its window has ended unless a new one opened since
(``fanout_worker.sweeper``); ``reset`` empties the table.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from dataclasses import dataclass

from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableEntity, UpdateMode
from limits import RateLimitItemPerMinute
from limits.aio.storage import Storage as LimitsStorage
from limits.aio.strategies import FixedWindowRateLimiter

from timeline.errors import RateLimitedError, StorageUnavailableError, contention
from timeline.retry import ETAG_ATTEMPTS, backoff_delay
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.names import RATE_LIMITS
from timeline.tables.expiries import RATE_LIMIT, ExpiriesRepository
from timeline.tables.rows import delete_entity, get_entity, if_unchanged

_ROW = "window"
_LOST_RACE = frozenset({404, 409, 412})
"""Cleared meanwhile (404), created meanwhile (409), changed meanwhile (412): read again."""


def partition_of(key: str) -> str:
    """The row's partition: the key's SHA-256, since keys may hold characters (``/``, ``#``,
    ``?``, control characters) that table keys may not."""
    return hashlib.sha256(key.encode()).hexdigest()


class TableWindowStorage(LimitsStorage):
    """A ``limits`` storage backend on the ``rateLimits`` table, exact under concurrency.

    Every request is routed right before it is made (``Storage.reader`` for reads,
    ``Storage.table`` for writes), never by a cached client, because the account holding a
    partition can change while a rebalance runs. Outages surface as
    ``StorageUnavailableError`` (a retryable 503), which ``limits`` passes through unwrapped.
    """

    STORAGE_SCHEME = None

    def __init__(self, storage: Storage) -> None:
        super().__init__()
        self._storage = storage
        self._expiries = ExpiriesRepository(storage)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return StorageUnavailableError

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        """Count ``amount`` hits on ``key``, opening a window of ``expiry`` seconds when none
        is open; returns the window's count including these hits."""
        partition = partition_of(key)
        # a round is lost only to another hit on the key: this many concurrent hits all land
        for attempt in range(1, ETAG_ATTEMPTS + 1):
            row = await self._read(partition)
            now = time.time()
            count, expires_at = _counted(row, now, amount, expiry)
            if _live(row, now) is None:  # a new window: filed to end with it, before it exists
                await self._expiries.note(RATE_LIMIT, RATE_LIMITS, partition, _ROW, at=expires_at)
            try:
                await self._write(partition, row, count, expires_at)
                return count
            except HttpResponseError as error:
                if error.status_code not in _LOST_RACE:
                    raise
            await asyncio.sleep(backoff_delay(attempt, base=0.005, cap=0.1))
        raise contention("one rate limit")

    async def get(self, key: str) -> int:
        row = _live(await self._read(partition_of(key)), time.time())
        return 0 if row is None else int(row["count"])

    async def get_expiry(self, key: str) -> float:
        now = time.time()
        row = _live(await self._read(partition_of(key)), now)
        return now if row is None else float(row["expires_at"])

    async def check(self) -> bool:
        """Whether the table answers (for the key ``health``'s partition)."""
        try:
            await self._read(partition_of("health"))
        except StorageUnavailableError:
            return False
        return True

    async def clear(self, key: str) -> None:
        await self._delete(partition_of(key))

    async def reset(self) -> int | None:
        """Delete every row of every account's ``rateLimits``; returns how many there were."""
        partitions: set[str] = set()  # a partition a rebalance is copying is on two accounts
        for account in range(len(self._storage.account_ids)):
            client = self._storage.account_table(account, RATE_LIMITS)
            async with self._storage.guard():
                rows = client.list_entities(select=["PartitionKey"])
                partitions |= {row["PartitionKey"] async for row in rows}
        for partition in partitions:
            await self._delete(partition)
        return len(partitions)

    async def _read(self, partition: str) -> TableEntity | None:
        return await get_entity(self._storage, RATE_LIMITS, partition, _ROW)

    async def _write(
        self, partition: str, read: TableEntity | None, count: int, expires_at: float
    ) -> None:
        """Create the row if ``read`` found none, else replace it if unchanged since read."""
        row = {"PartitionKey": partition, "RowKey": _ROW, "count": count, "expires_at": expires_at}
        async with self._storage.guard():
            client = self._storage.table(RATE_LIMITS, partition)
            if read is None:
                await calls.create_entity(client, row)
            else:
                await calls.update_entity(
                    client, row, mode=UpdateMode.REPLACE, **if_unchanged(read)
                )

    async def _delete(self, partition: str) -> None:
        await delete_entity(self._storage, RATE_LIMITS, partition, _ROW)


def _live(row: TableEntity | None, now: float) -> TableEntity | None:
    """``row`` if its window is still open."""
    return row if row is not None and float(row["expires_at"]) > now else None


def _counted(row: TableEntity | None, now: float, amount: int, expiry: int) -> tuple[int, float]:
    """The row's ``(count, expires_at)`` after ``amount`` more hits at ``now``."""
    live = _live(row, now)
    if live is None:
        return amount, now + expiry
    return int(live["count"]) + amount, float(live["expires_at"])


class RateLimiter:
    """At most ``per_minute`` hits per key; ``0`` turns the limit off (no storage calls)."""

    def __init__(
        self, limiter: FixedWindowRateLimiter, per_minute: int, name: str, what: str
    ) -> None:
        self._item = RateLimitItemPerMinute(per_minute) if per_minute else None
        self._limiter = limiter
        self._name = name
        self._what = what

    async def check(self, key: str) -> None:
        """Count one hit by ``key`` or raise ``RateLimitedError`` with a Retry-After."""
        item = self._item
        if item is None or await self._limiter.hit(item, self._name, key):
            return
        reset_at = await self._limiter.storage.get_expiry(item.key_for(self._name, key))
        window = item.get_expiry()
        retry_after = min(window, max(1, math.ceil(reset_at - time.time())))
        raise RateLimitedError(
            f"at most {item.amount} {self._what} per minute", retry_after=retry_after
        )


@dataclass(frozen=True, slots=True)
class RateLimits:
    """One limiter per kind of write: posts and other writes per user, sign-ups per address.
    The name each limiter adds to its keys keeps their counts apart in the one table."""

    posts: RateLimiter
    writes: RateLimiter
    registrations: RateLimiter

    @classmethod
    def per_minute(
        cls, storage: Storage, *, posts: int, writes: int, registrations: int
    ) -> RateLimits:
        limiter = FixedWindowRateLimiter(TableWindowStorage(storage))
        return cls(
            RateLimiter(limiter, posts, "posts", "posts"),
            RateLimiter(limiter, writes, "writes", "follows, unfollows and deletes"),
            RateLimiter(limiter, registrations, "registrations", "registrations from one address"),
        )
