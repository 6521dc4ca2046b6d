"""The Azure SDKs' own calls, with the signatures of ``timeline.storage.calls`` and
``timeline.storage.wire.lean_queue``: the oracle the lean path's tests compare it with, on the
same clients. ``TABLE_PATHS`` and ``QUEUE_PATHS`` name both paths' modules, so a test runs
one body on either."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from azure.core import MatchConditions
from azure.data.tables import TableEntity, UpdateMode
from azure.data.tables.aio import TableClient
from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from timeline.model.entities import Page
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, TransactionOperation
from timeline.storage.wire import lean_queue


async def query_page(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str] | None,
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[TableEntity]:
    """One page of the SDK's pager, and its continuation (the SDK's token is a dict)."""
    entities: Any = client.query_entities(
        query_filter, parameters=parameters, select=select, results_per_page=limit
    )
    pager = entities.by_page(continuation_token=continuation)
    try:
        page = await pager.__anext__()
    except StopAsyncIteration:
        return Page([], None)
    items = [entity async for entity in page]
    return Page(items, pager.continuation_token or None)


async def query_rows(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str],
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[dict[str, Any]]:
    """``query_page``, its entities as the rows."""
    page = await query_page(
        client, query_filter, parameters, select=select, limit=limit, continuation=continuation
    )
    return Page(list(page.items), page.continuation)


async def submit_batch(
    storage: Storage, table: str, partition_key: str, operations: list[Operation]
) -> None:
    """What ``calls.submit_batch`` sends, through the SDK: one operation as its own call
    (an upsert replaces), more as one transaction. (Without its resend of a batch that a
    missing delete failed: that is the lean path's own behaviour.)"""
    client = storage.table(table, partition_key)
    if len(operations) == 1:
        kind, entity = operations[0]
        if kind == "delete":
            await client.delete_entity(entity["PartitionKey"], entity["RowKey"])
        else:
            await client.upsert_entity(entity, mode=UpdateMode.REPLACE)
        return
    await client.submit_transaction(
        [
            (kind, entity) if kind == "delete" else ("upsert", entity, {"mode": UpdateMode.REPLACE})
            for kind, entity in operations
        ]
    )


async def transact(
    storage: Storage, table: str, partition_key: str, operations: list[TransactionOperation]
) -> None:
    await storage.table(table, partition_key).submit_transaction(operations)


async def get_entity(
    client: TableClient, partition_key: str, row_key: str, *, select: list[str] | None = None
) -> TableEntity:
    return await client.get_entity(partition_key, row_key, select=select)


async def create_entity(client: TableClient, entity: Mapping[str, Any]) -> Mapping[str, Any]:
    return await client.create_entity(entity)


async def update_entity(
    client: TableClient,
    entity: Mapping[str, Any],
    mode: UpdateMode = UpdateMode.MERGE,
    *,
    etag: str | None = None,
    match_condition: MatchConditions | None = None,
) -> Mapping[str, Any]:
    return await client.update_entity(entity, mode, etag=etag, match_condition=match_condition)


async def delete_entity(
    client: TableClient,
    partition_key: str,
    row_key: str,
    *,
    etag: str | None = None,
    match_condition: MatchConditions | None = None,
) -> None:
    await client.delete_entity(partition_key, row_key, etag=etag, match_condition=match_condition)


async def receive_messages(
    client: QueueClient, count: int, visibility_timeout: int
) -> list[QueueMessage]:
    """One receive of up to ``count`` messages (one page of the SDK's pager)."""
    pager = client.receive_messages(
        messages_per_page=count, max_messages=count, visibility_timeout=visibility_timeout
    )
    return [message async for message in pager]


async def send_message(
    client: QueueClient,
    content: str,
    *,
    visibility_timeout: int | None = None,
    time_to_live: int | None = None,
) -> QueueMessage:
    return await client.send_message(
        content, visibility_timeout=visibility_timeout, time_to_live=time_to_live
    )


async def update_message(
    client: QueueClient,
    message: QueueMessage,
    content: str | None = None,
    *,
    visibility_timeout: int | None = None,
) -> QueueMessage:
    return await client.update_message(
        message, content=content, visibility_timeout=visibility_timeout
    )


async def delete_message(client: QueueClient, message: QueueMessage) -> None:
    await client.delete_message(message)


TABLE_PATHS: dict[str, ModuleType] = {"lean": calls, "sdk": sys.modules[__name__]}
"""``timeline.storage.calls`` (the lean path) and this module (the SDK's calls)."""
QUEUE_PATHS: dict[str, ModuleType] = {"lean": lean_queue, "sdk": sys.modules[__name__]}
"""``timeline.storage.wire.lean_queue`` (the lean path) and this module (the SDK's calls)."""
