"""Removal traces: a small row left in a partition, in the same Entity Group Transaction as
the removal of a post row (a delete, an unfollow's purge), so that a live stream, which reads
what *landed* in a partition since a moment (``Timestamp ge``), also sees what went.

A trace's key is ``~gone-{the removed row key}``: it starts with ``~`` like every metadata
row, so page reads, ``since`` reads, trims and counts (which all stop below ``~`` or read
``~count-NN`` rows only) never see it. Writing one is an upsert, so a removal sent twice leaves
one trace (with a newer ``Timestamp``: a stream may send its delete event twice).

A trace lives until a sweep finds it older than ``TRACE_LIFETIME_S`` (longer than any
stream's look-back), with no trim needed: a purge sweeps its timeline after it deletes (at
least as many expired traces as it wrote), a delete's second pass each timeline it passes,
an author's delete its ``posts`` partition, and a trim those its one query reads. Every
sweep deletes a trace only if unchanged since it read it: one rewritten meanwhile (a new
removal of the same row) is young again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, failed_index, query_page, transact
from timeline.tables.rows import PARTITION, if_unchanged, if_unchanged_etag

TRACE_PREFIX = "~gone-"
TRACE_RANGE = "RowKey ge @trace_low and RowKey lt @trace_high"
TRACES_END = TRACE_PREFIX[:-1] + "."
"""Every trace key sorts below this (``-`` sorts just before ``.``)."""
TRACE_BOUNDS = {"trace_low": TRACE_PREFIX, "trace_high": TRACES_END}
TRACE_LIFETIME_S = 3600.0
"""How long a trace outlives its removal: the most a stream looks back (the setting's
bound), so no stream misses one; a sweep after that removes it."""
SWEEP_TRACES = 100
"""Traces one sweep removes at most (one query and one batch)."""


def trace_key(row_key: str) -> str:
    return TRACE_PREFIX + row_key


def traced_row(row_key: str) -> str | None:
    """The row key a trace's key names (None: not a trace)."""
    return row_key.removeprefix(TRACE_PREFIX) if row_key.startswith(TRACE_PREFIX) else None


def trace(partition: str, row_key: str) -> Operation:
    """The upsert that records the removal of ``row_key`` from ``partition``."""
    return ("trace", {"PartitionKey": partition, "RowKey": trace_key(row_key)})


def trace_of(keys: dict[str, Any]) -> tuple[Any, ...]:
    """The transaction operation that records the delete of the row with ``keys``."""
    _, entity = trace(keys["PartitionKey"], keys["RowKey"])
    return ("upsert", entity, {"mode": UpdateMode.REPLACE})


def traced_deletes(partition: str, rows: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
    """Transaction operations: each ``(row key, etag)`` deleted if unchanged, then its trace."""
    batch: list[tuple[Any, ...]] = []
    for row_key, tag in rows:
        keys = {"PartitionKey": partition, "RowKey": row_key}
        batch.append(("delete", keys, if_unchanged_etag(tag)))
        batch.append(trace_of(keys))
    return batch


def expired_traces(rows: list[TableEntity]) -> list[TableEntity]:
    """The traces among ``rows`` (read with their ``Timestamp`` and etag) that expired."""
    before = datetime.now(UTC) - timedelta(seconds=TRACE_LIFETIME_S)
    expired: list[TableEntity] = []
    for row in rows:
        stamp = row.metadata["timestamp"]
        if traced_row(row["RowKey"]) is not None and stamp is not None and stamp < before:
            expired.append(row)
    return expired


def unchanged_deletes(partition: str, rows: list[TableEntity]) -> list[tuple[Any, ...]]:
    """Transaction operations: each row deleted only if unchanged since it was read (a trace
    rewritten since by a new removal is young again)."""
    return [
        ("delete", {"PartitionKey": partition, "RowKey": row["RowKey"]}, if_unchanged(row))
        for row in rows
    ]


async def sweep_traces(
    storage: Storage, table: str, partition: str, *, at_least: int = 0, now: datetime | None = None
) -> int:
    """Remove the traces older than ``TRACE_LIFETIME_S``: ``SWEEP_TRACES`` per key-only query
    and batch, until a query finds fewer or ``at_least`` went; returns how many went."""
    removed = 0
    while True:
        found = await _expired_page(storage, table, partition, now)
        removed += await delete_unchanged(
            storage, table, partition, unchanged_deletes(partition, found)
        )
        if len(found) < SWEEP_TRACES or removed >= at_least:
            return removed


async def _expired_page(
    storage: Storage, table: str, partition: str, now: datetime | None
) -> list[TableEntity]:
    before = (now or datetime.now(UTC)) - timedelta(seconds=TRACE_LIFETIME_S)
    async with storage.guard(kind="query-100"):
        page = await query_page(
            storage.reader(table, partition),
            f"{PARTITION} and {TRACE_RANGE} and Timestamp lt @before",
            {"pk": partition, "before": before, **TRACE_BOUNDS},
            select=["RowKey"],
            limit=SWEEP_TRACES,
            continuation=None,
        )
    return page.items


async def delete_unchanged(
    storage: Storage, table: str, partition: str, batch: list[tuple[Any, ...]]
) -> int:
    """One transaction of deletes; one that fails on a row gone (404) or changed since read
    (412) is dropped and the rest sent again. Returns how many were deleted."""
    batch = list(batch)
    while batch:
        try:
            await transact(storage, table, partition, batch)
            return len(batch)
        except TableTransactionError as error:
            index = failed_index(error, 404, 412)
            if index is None:
                raise
            del batch[index]
    return 0
