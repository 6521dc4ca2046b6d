"""Removal traces: a small row left in a partition, in the same Entity Group Transaction as
the removal of a post row (a delete, an unfollow's purge), so that a live stream, which reads
what *landed* in a partition since a moment (``Timestamp ge``), also sees what went.

A trace's key is ``~gone-{the removed row key}``: it starts with ``~`` like every metadata
row, so page reads, ``since`` reads, trims and counts (which all stop below ``~`` or read
``~count`` rows only) never see it. Writing one is an upsert, so a removal sent twice leaves
one trace (with a newer ``Timestamp``: a stream may send its delete event twice).

A trace lives until a sweep finds it older than ``TRACE_LIFETIME_S`` (longer than any
stream's look-back): a timeline's traces go with its next trim (whose one query reads them
after the entries, so the sweep costs no request more unless it deletes), a posts
partition's with the author's next delete (one query more per delete, which deletes only
traces unchanged since it read them).
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


def with_traces(operations: list[Operation]) -> list[Operation]:
    """Each delete followed by its trace (other operations as they are)."""
    traced: list[Operation] = []
    for kind, entity in operations:
        traced.append((kind, entity))
        if kind == "delete":
            traced.append(trace(entity["PartitionKey"], entity["RowKey"]))
    return traced


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


def expired_traces(rows: list[TableEntity], *, now: datetime | None = None) -> list[str]:
    """The keys of the traces among ``rows`` (read with their ``Timestamp``) that expired."""
    before = (now or datetime.now(UTC)) - timedelta(seconds=TRACE_LIFETIME_S)
    expired: list[str] = []
    for row in rows:
        stamp = row.metadata["timestamp"]
        if traced_row(row["RowKey"]) is not None and stamp is not None and stamp < before:
            expired.append(row["RowKey"])
    return expired


async def sweep_traces(
    storage: Storage, table: str, partition: str, *, now: datetime | None = None
) -> int:
    """Remove up to ``SWEEP_TRACES`` traces older than ``TRACE_LIFETIME_S``: one key-only
    query, then (only when it found some) one batch; returns how many went."""
    before = (now or datetime.now(UTC)) - timedelta(seconds=TRACE_LIFETIME_S)
    async with storage.guard(kind="query-100"):
        page = await query_page(
            storage.reader(table, partition),
            f"{PARTITION} and {TRACE_RANGE} and Timestamp lt @before",
            {"pk": partition, "before": before, **TRACE_BOUNDS},
            select=["PartitionKey", "RowKey"],
            limit=SWEEP_TRACES,
            continuation=None,
        )
    if not page.items:
        return 0
    return await _remove(storage, table, partition, page.items)


async def _remove(storage: Storage, table: str, partition: str, rows: list[TableEntity]) -> int:
    batch: list[tuple[Any, ...]] = [("delete", row, if_unchanged(row)) for row in rows]
    try:
        await transact(storage, table, partition, batch)
    except TableTransactionError as error:
        if failed_index(error, 404, 412) is None:
            raise
        return 0  # one was rewritten or removed meanwhile: the next sweep takes the rest
    return len(batch)
