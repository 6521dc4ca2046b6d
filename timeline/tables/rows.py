"""Row helpers the table repositories share: point reads, creates, partition listings and
the conditions of conditional writes.

Rows whose key starts with ``~`` are metadata (counters, idempotency keys);
user ids and post row keys never do, and every listing query stops below ``~``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity, UpdateMode

from timeline.model.entities import Edge, Page
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, size_kind

MERGE = UpdateMode.MERGE
META = "~"
"""Row keys from here on are metadata: counters and idempotency keys."""
PARTITION = "PartitionKey eq @pk"
LISTING = "PartitionKey eq @pk and RowKey lt @meta"
FIRST_POST_KEY = "0"
"""Every post row key (19 digits, ``_``, post id) sorts after this and every head row before."""
POST_LISTING = "PartitionKey eq @pk and RowKey ge @first and RowKey lt @meta"
"""A timeline's posts: its head rows (merge rows, ``timeline.tables.audience``) sort before them."""


def etag(entity: TableEntity) -> str:
    return str(entity.metadata["etag"])


def if_unchanged(entity: TableEntity) -> dict[str, Any]:
    return if_unchanged_etag(etag(entity))


def if_unchanged_etag(etag: str) -> dict[str, Any]:
    return {"etag": etag, "match_condition": MatchConditions.IfNotModified}


async def create_entity(storage: Storage, table: str, entity: dict[str, Any]) -> bool:
    """Insert ``entity``; False when a row with its keys exists (nothing is changed)."""
    async with storage.guard(kind="write-1"):
        try:
            await calls.create_entity(storage.table(table, entity["PartitionKey"]), entity)
            return True
        except ResourceExistsError:
            return False


async def merge_existing(storage: Storage, table: str, row: dict[str, Any]) -> bool:
    """Merge ``row``'s properties into its row if there is one (never creates it): False when
    there is none."""
    async with storage.guard(kind="write-1"):
        try:
            await calls.update_entity(storage.table(table, row["PartitionKey"]), row, MERGE)
        except ResourceNotFoundError:
            return False
    return True


async def delete_entity(
    storage: Storage, table: str, partition_key: str, row_key: str, unchanged: str | None = None
) -> bool:
    """Delete one row (a missing one is no error); with ``unchanged`` (an etag), only if the
    row still has it: False when it changed since read."""
    condition = {} if unchanged is None else if_unchanged_etag(unchanged)
    async with storage.guard(kind="write-1"):
        client = storage.table(table, partition_key)
        try:
            await calls.delete_entity(client, partition_key, row_key, **condition)
        except ResourceModifiedError:
            return False
    return True


async def get_entity(
    storage: Storage,
    table: str,
    partition_key: str,
    row_key: str,
    *,
    select: list[str] | None = None,
) -> TableEntity | None:
    """One point read by both keys (the cheapest call there is); None when missing."""
    async with storage.guard(kind="read"):
        client = storage.reader(table, partition_key)
        try:
            return await calls.get_entity(client, partition_key, row_key, select=select)
        except ResourceNotFoundError:
            return None


async def partition_page(
    storage: Storage,
    table: str,
    partition_key: str,
    *,
    select: list[str],
    limit: int,
    continuation: dict[str, str] | None,
    posts_only: bool = False,
    until: str = META,
) -> Page[TableEntity]:
    """One page of one partition's listing rows (metadata excluded, and those from ``until``
    on): one storage query."""
    filter_text, parameters = LISTING, {"pk": partition_key, "meta": until}
    if posts_only:
        filter_text, parameters = POST_LISTING, {**parameters, "first": FIRST_POST_KEY}
    async with storage.guard(kind=size_kind("query", limit)):
        return await query_page(
            storage.reader(table, partition_key),
            filter_text,
            parameters,
            select=select,
            limit=limit,
            continuation=continuation,
        )


async def scan(
    storage: Storage,
    table: str,
    partition_key: str,
    condition: str,
    parameters: dict[str, Any],
) -> AsyncIterator[str]:
    """Row keys of one partition matching ``condition``, 1,000 per storage query."""
    continuation: dict[str, str] | None = None
    while True:
        async with storage.guard(kind="query-1000"):
            page = await query_page(
                storage.reader(table, partition_key),
                f"{PARTITION} and {condition}",
                {"pk": partition_key, **parameters},
                select=["RowKey"],
                limit=1000,
                continuation=continuation,
            )
        for entity in page.items:
            yield entity["RowKey"]
        continuation = page.continuation
        if continuation is None:
            return


async def row_keys_between(
    storage: Storage, table: str, partition_key: str, first: str, last: str
) -> set[str]:
    """Row keys in ``[first, last]`` of one partition."""
    condition = "RowKey ge @first and RowKey le @last"
    keys = scan(storage, table, partition_key, condition, {"first": first, "last": last})
    return {key async for key in keys}


async def edge_page(
    storage: Storage,
    table: str,
    partition_key: str,
    limit: int,
    continuation: dict[str, str] | None,
    *,
    until: str = META,
) -> Page[Edge]:
    page = await partition_page(
        storage,
        table,
        partition_key,
        select=["RowKey", "since"],
        limit=limit,
        continuation=continuation,
        until=until,
    )
    edges = [Edge(entity["RowKey"], entity["since"]) for entity in page.items]
    return Page(edges, page.continuation)


async def drop_partition(
    storage: Storage, table: str, partition_key: str, *, keep: str | None = None
) -> int:
    """Delete every row of one partition (but the row ``keep``), metadata included (a list's
    timeline or member index once the list is gone): a query per 1,000 rows (following
    storage's continuation: a page may come back short, even empty, before the end), an EGT
    per 100. The rows deleted."""
    dropped = 0
    continuation: dict[str, str] | None = None
    while True:
        async with storage.guard(kind="query-1000"):
            page = await query_page(
                storage.reader(table, partition_key),
                PARTITION,
                {"pk": partition_key},
                select=["RowKey"],
                limit=1000,
                continuation=continuation,
            )
        keys = [str(row["RowKey"]) for row in page.items if row["RowKey"] != keep]
        for chunk in calls.chunked(keys):
            deletes = [("delete", {"PartitionKey": partition_key, "RowKey": key}) for key in chunk]
            await calls.submit_batch(storage, table, partition_key, deletes)
        dropped += len(keys)
        continuation = page.continuation
        if continuation is None:
            return dropped
