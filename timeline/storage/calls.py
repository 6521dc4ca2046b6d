"""One storage call each: a page of a query, a batch of idempotent writes, a transaction,
a single entity's read, insert, update or delete, all on the lean path (``lean``,
``lean_single``: the SDK's requests, answers and errors without its model layer).

The query and single-entity calls are the wire functions themselves, named here so that
callers have one place to take a storage call from; they run inside the caller's
``Storage.guard``. The batch calls below take their own place in the limiter through
``Storage.guard`` and are routed to the partition's account at the moment they are sent."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from azure.data.tables import TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient

from timeline.storage.wire import lean
from timeline.storage.wire.lean import query_page as query_page
from timeline.storage.wire.lean import query_rows as query_rows
from timeline.storage.wire.lean import to_entity as to_entity
from timeline.storage.wire.lean_single import create_entity as create_entity
from timeline.storage.wire.lean_single import delete_entity as delete_entity
from timeline.storage.wire.lean_single import get_entity as get_entity
from timeline.storage.wire.lean_single import update_entity as update_entity

if TYPE_CHECKING:
    from timeline.storage.accounts import Storage

MAX_BATCH_OPERATIONS = 100
"""Entity Group Transactions take at most 100 operations (Azurite breaks above that)."""


Operation = tuple[str, dict[str, Any]]
"""``("upsert", entity)`` or ``("delete", keys)``: idempotent, so safe to retry. A
``("trace", entity)`` is an upsert that belongs to the delete just before it (it records the
removal): it goes when that delete is dropped."""


async def submit_batch(
    storage: Storage, table: str, partition_key: str, operations: list[Operation]
) -> None:
    """Write ≤ 100 idempotent operations on one partition: a plain call for one, else an EGT.

    Deleting an already-missing row is not an error: inside a batch it fails the whole
    transaction, so that operation is dropped (with the trace that follows it, if any) and
    the rest resent.
    """
    batch = list(operations)
    while batch:
        async with storage.guard(kind=size_kind("write", len(batch))):
            client = storage.table(table, partition_key)  # routed again for every request
            try:
                await _send(client, batch)
                return
            except TableTransactionError as error:
                index = error.index
                if error.status_code != 404 or index is None or batch[index][0] != "delete":
                    raise
                end = index + 1
                while end < len(batch) and batch[end][0] == "trace":
                    end += 1
                del batch[index:end]


async def submit_fresh(
    storage: Storage,
    table: str,
    partition_key: str,
    fresh: Callable[[], list[Operation]],
    rows: int = MAX_BATCH_OPERATIONS,
) -> None:
    """One request of idempotent upserts on one partition, whose operations are taken from
    ``fresh`` only once the request holds its place to go out (after any wait in the
    limiter): a write that must leave by a deadline is checked against it at the last
    moment. Nothing is sent when ``fresh`` gives nothing. ``rows``: about how many it gives
    (the request's size, for the limiter)."""
    async with storage.guard(kind=size_kind("write", rows)):
        operations = fresh()
        if operations:
            await _send(storage.table(table, partition_key), operations)


async def _send(client: TableClient, operations: list[Operation]) -> None:
    if len(operations) == 1:
        kind, entity = operations[0]
        if kind == "delete":
            await delete_entity(client, entity["PartitionKey"], entity["RowKey"])
        else:
            await lean.upsert_entity(client, entity)
        return
    await lean.submit_transaction(client, [_transaction_operation(op) for op in operations])


def size_kind(verb: str, rows: int) -> str:
    """A request's kind for the limiter: its verb and its size to a power of ten."""
    return f"{verb}-{10 ** math.ceil(math.log10(max(1, rows)))}"


def _transaction_operation(operation: Operation) -> tuple[Any, ...]:
    kind, entity = operation
    if kind == "delete":
        return (kind, entity)
    return ("upsert", entity, {"mode": UpdateMode.REPLACE})


def chunked(items: Iterable[Any], size: int = MAX_BATCH_OPERATIONS) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


TransactionOperation = tuple[Any, ...]
"""An SDK transaction operation: ``(kind, entity)`` or ``(kind, entity, options)``."""


async def transact(
    storage: Storage, table: str, partition_key: str, operations: list[TransactionOperation]
) -> None:
    """One Entity Group Transaction, all or nothing; raises ``TableTransactionError`` with the
    failing operation's index (conflicts and failed conditions are the caller's to judge)."""
    async with storage.guard(kind=size_kind("write", len(operations))):
        await lean.submit_transaction(storage.table(table, partition_key), operations)


def failed_index(error: TableTransactionError, *statuses: int) -> int | None:
    """The index of the operation that failed the transaction with one of ``statuses``."""
    return error.index if error.status_code in statuses else None
