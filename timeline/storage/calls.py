"""One storage call each: a page of a query, a batch of idempotent writes, a transaction,
a single entity's read, insert, update or delete, all on the lean path (``lean``,
``lean_single``: the SDK's requests, answers and errors without its model layer).

Each holds its place in the limiter through ``Storage.guard`` and is routed to the
partition's account at the moment it is sent."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from azure.core import MatchConditions
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient

from timeline.model.entities import Page
from timeline.storage.wire import lean, lean_single

if TYPE_CHECKING:
    from timeline.storage.accounts import Storage

MAX_BATCH_OPERATIONS = 100
"""Entity Group Transactions take at most 100 operations (Azurite breaks above that)."""


async def query_page(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str] | None,
    limit: int,
    continuation: dict[str, str] | None,
    on_headers: Callable[[Mapping[str, str]], None] | None = None,
) -> Page[TableEntity]:
    """Exactly one storage query: up to ``limit`` entities and the storage continuation
    (``on_headers`` is given the response's headers, e.g. for the server's ``Date``)."""
    return await lean.query_page(
        client,
        query_filter,
        parameters,
        select=select,
        limit=limit,
        continuation=continuation,
        on_headers=on_headers,
    )


async def query_rows(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str],
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[dict[str, Any]]:
    """``query_page`` for pages whose selected properties are strings and booleans (a read's
    hot path): each row as the response's JSON decoded it (the values the SDK gives), with no
    entity built per row."""
    return await lean.query_rows(
        client, query_filter, parameters, select=select, limit=limit, continuation=continuation
    )


def as_entity(row: dict[str, Any]) -> TableEntity:
    """A row ``query_rows`` gave, as ``query_page`` gives it: typed, its etag in
    ``metadata`` (for the few rows of a page that are not posts)."""
    return lean.to_entity(row)


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


async def get_entity(
    client: TableClient, partition_key: str, row_key: str, *, select: list[str] | None = None
) -> TableEntity:
    """``client.get_entity``'s answer: the row, or the SDK's ``ResourceNotFoundError``."""
    return await lean_single.get_entity(client, partition_key, row_key, select=select)


async def create_entity(client: TableClient, entity: Mapping[str, Any]) -> Mapping[str, Any]:
    """``client.create_entity``'s answer (``ResourceExistsError`` when the row exists)."""
    return await lean_single.create_entity(client, entity)


async def update_entity(
    client: TableClient,
    entity: Mapping[str, Any],
    mode: UpdateMode = UpdateMode.MERGE,
    *,
    etag: str | None = None,
    match_condition: MatchConditions | None = None,
) -> Mapping[str, Any]:
    """``client.update_entity``'s answer (``ResourceModifiedError`` when the etag no longer
    matches)."""
    return await lean_single.update_entity(
        client, entity, mode, etag=etag, match_condition=match_condition
    )


async def delete_entity(
    client: TableClient,
    partition_key: str,
    row_key: str,
    *,
    etag: str | None = None,
    match_condition: MatchConditions | None = None,
) -> None:
    """``client.delete_entity``'s answer (a missing row is no error)."""
    await lean_single.delete_entity(
        client, partition_key, row_key, etag=etag, match_condition=match_condition
    )


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
