"""Sharded counters: a partition's count is the sum of its counter rows.

One counter row per partition serialises every writer of a hot partition (a user everyone
follows at once) on one ETag. So a count is spread over ``SHARDS`` rows ``~count-00`` ..
``~count-15``, read by summing them with one range query.

A change picks a shard at random among those no other change in this process holds, reads
it (one point read) and writes the fact together with the shard in one Entity Group
Transaction on the shard's ETag: the fact and its count change land together or not at all.
A conflict on the shard alone (another process's writer got there first) is retried on
another random shard after a capped, fully jittered backoff, for a time budget of a few
storage timeouts rather than a fixed number of rounds. A shard may go negative (a follow
counted on one shard, its unfollow on another): only the sum means anything, and it is
clamped at 0 when read.

Counter keys start with ``~`` like every metadata row, so listings (which stop below ``~``)
never see them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.errors import contention
from timeline.metrics import COUNTER_CONFLICTS
from timeline.retry import backoff_delay
from timeline.storage.accounts import Storage
from timeline.storage.calls import TransactionOperation, failed_index, query_page, transact
from timeline.tables.rows import get_entity, if_unchanged

COUNT_PREFIX = "~count-"
"""Every counter row's key starts so: ``~count-NN``, one per shard."""
MEMBERSHIPS_PREFIX = "~lists-"
"""A second counter of a ``subjectFollowers`` partition, its lists' memberships
(``~lists-NN``): uncounted as followers, counted toward the hybrid threshold."""
REACH_BOUNDS = {"count_low": COUNT_PREFIX, "count_high": MEMBERSHIPS_PREFIX[:-1] + "."}
"""Both counters of a ``subjectFollowers`` partition (``~count-`` to ``~lists.``): no other
row of it sorts between them (``~copy-`` sorts before, ``~mode`` and ``~request-`` after)."""
SHARDS = 16
"""Counter rows per partition. Changes in one process never share a shard (``_CHANGING``),
so shards only have to spread processes; more would only lengthen every count read."""
COUNT_RANGE = "RowKey ge @count_low and RowKey lt @count_high"
WRITE_BUDGET_TIMEOUTS = 3
"""A change keeps retrying a contended counter for this many storage timeouts."""
_BACKOFF_BASE_S = 0.005
_BACKOFF_CAP_S = 0.2
_MAX_BACKOFF_ATTEMPT = 8
"""The exponent passed to the backoff is capped here, so it never overflows however long."""


def shard_key(shard: int, prefix: str = COUNT_PREFIX) -> str:
    return f"{prefix}{shard:02d}"


def total(rows: Iterable[TableEntity]) -> int:
    """The count a partition's counter rows add up to (clamped at 0)."""
    return max(0, sum(int(row.get("n", 0)) for row in rows))


async def count_of(
    storage: Storage, table: str, partition_key: str, prefix: str = COUNT_PREFIX
) -> int:
    """The sum of one partition's counter rows (those of another counter: ``prefix``): one
    range query (0 when none exists)."""
    return (await counts_of(storage, table, partition_key, prefix))[0]


async def counts_of(storage: Storage, table: str, partition_key: str, *prefixes: str) -> list[int]:
    """The sums of several counters of one partition, in one range query from the first
    prefix to the end of the last (rows of neither in between are read and left out)."""
    rows: list[TableEntity] = []
    continuation: dict[str, str] | None = None
    low, high = min(prefixes), max(prefixes)[:-1] + "."
    while True:  # real Azure may return a short page with a continuation
        async with storage.guard(kind="count"):
            page = await query_page(
                storage.reader(table, partition_key),
                f"PartitionKey eq @pk and {COUNT_RANGE}",
                {"pk": partition_key, "count_low": low, "count_high": high},
                select=["RowKey", "n"],
                limit=1000,
                continuation=continuation,
            )
        rows.extend(page.items)
        continuation = page.continuation
        if continuation is None:
            return [total(r for r in rows if str(r["RowKey"]).startswith(p)) for p in prefixes]


async def transact_counted(
    storage: Storage,
    table: str,
    partition_key: str,
    rows: list[TransactionOperation],
    delta: int,
    prefix: str = COUNT_PREFIX,
) -> None:
    """Submit ``rows`` and move the partition's count (another counter: ``prefix``) by
    ``delta`` in one transaction.

    Raises the ``TableTransactionError`` of a failure in ``rows`` (the caller's to judge);
    a conflict on the counter shard is retried on another shard."""
    if not delta:
        await transact(storage, table, partition_key, rows)
        return
    deadline = asyncio.get_running_loop().time() + WRITE_BUDGET_TIMEOUTS * storage.options.timeout_s
    shard, attempt = None, 0
    while True:
        async with _claimed_shard(table, partition_key, shard, deadline) as shard:
            shard_change = await _shard_operation(
                storage, table, partition_key, shard_key(shard, prefix), delta
            )
            try:
                await transact(storage, table, partition_key, [*rows, shard_change])
                return
            except TableTransactionError as error:
                if failed_index(error, 409, 412) != len(rows):
                    raise
        COUNTER_CONFLICTS.inc()  # another process changed the shard between read and write
        attempt += 1
        await _back_off(attempt, deadline)


@dataclass
class _Changing:
    """The shards of one partition that changes in this process hold now."""

    free: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SHARDS))
    held: set[int] = field(default_factory=set)
    users: int = 0


_CHANGING: dict[tuple[str, str], _Changing] = {}
"""Per process: changes of one partition in one process never race each other on a shard
(they would only throw each other's writes away); past ``SHARDS`` at once they queue here,
at no storage cost. Only other processes' changes can conflict."""


@contextlib.asynccontextmanager
async def _claimed_shard(
    table: str, partition_key: str, previous: int | None, deadline: float
) -> AsyncIterator[int]:
    """A random shard no other change of the partition in this process holds (not
    ``previous`` if another is free), held while the change is made."""
    key = (table, partition_key)
    changing = _CHANGING.setdefault(key, _Changing())
    changing.users += 1
    try:
        await _acquire(changing.free, deadline)
        try:
            shard = _pick(changing.held, previous)
            changing.held.add(shard)
            try:
                yield shard
            finally:
                changing.held.discard(shard)
        finally:
            changing.free.release()
    finally:
        changing.users -= 1
        if not changing.users:
            del _CHANGING[key]


async def _acquire(free: asyncio.Semaphore, deadline: float) -> None:
    try:
        async with asyncio.timeout_at(deadline):
            await free.acquire()
    except TimeoutError:
        raise contention() from None


def _pick(held: set[int], previous: int | None) -> int:
    free = [shard for shard in range(SHARDS) if shard not in held]
    return random.choice([shard for shard in free if shard != previous] or free)  # noqa: S311


async def _back_off(attempt: int, deadline: float) -> None:
    delay = backoff_delay(
        min(attempt, _MAX_BACKOFF_ATTEMPT), base=_BACKOFF_BASE_S, cap=_BACKOFF_CAP_S
    )
    if asyncio.get_running_loop().time() + delay > deadline:
        raise contention()
    await asyncio.sleep(delay)


async def _shard_operation(
    storage: Storage, table: str, partition_key: str, key: str, delta: int
) -> TransactionOperation:
    """Create the shard with ``delta``, or rewrite it moved by ``delta`` if unchanged."""
    counter = await get_entity(storage, table, partition_key, key, select=["n"])
    if counter is None:
        return ("create", {"PartitionKey": partition_key, "RowKey": key, "n": delta})
    row = {"PartitionKey": partition_key, "RowKey": key, "n": int(counter["n"]) + delta}
    return ("update", row, {"mode": UpdateMode.REPLACE, **if_unchanged(counter)})


async def by_partition(
    rows: AsyncIterator[TableEntity],
) -> AsyncIterator[tuple[str, list[TableEntity]]]:
    """Group a table scan's rows by partition (a scan returns them in key order)."""
    current: str | None = None
    group: list[TableEntity] = []
    async for row in rows:
        if row["PartitionKey"] != current and current is not None:
            yield current, group
            group = []
        current = row["PartitionKey"]
        group.append(row)
    if current is not None:
        yield current, group
