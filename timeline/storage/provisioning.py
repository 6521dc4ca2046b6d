"""Create what storage needs (tables, member rows, the placement, queue shards), and list
what is missing."""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import TYPE_CHECKING

from azure.core.exceptions import HttpResponseError, ResourceExistsError
from azure.data.tables.aio import TableClient

from timeline.errors import ConfigurationError
from timeline.storage.clients import CONTROL
from timeline.storage.lease import MEMBER_KEYS, control_get
from timeline.storage.names import META_TABLE, TABLES
from timeline.storage.placement import PLACEMENT_TABLE, Placement

if TYPE_CHECKING:
    from timeline.storage.accounts import Storage


async def create_all(storage: Storage) -> None:
    """Create every table, the placement (when there is none) and every queue shard;
    existing ones are left as they are. Raises ``ConfigurationError`` when the stored
    placement does not match this configuration."""
    for account in storage.clients.tables:
        for name, client in account.items():
            if name != CONTROL:
                async with storage.guard(renew=False):
                    with suppress(ResourceExistsError):
                        await client.create_table()
    for account in storage.clients.tables:
        await _ensure_member_row(storage, account[CONTROL])
    await storage.lease.check_membership()  # before a placement naming these accounts is stored
    await _store_initial_placement(storage)
    if await storage.refresh_placement() is None:
        raise ConfigurationError(storage.lease.refused or "the placement could not be stored")
    for queue in storage.all_queues():
        async with storage.guard():
            with suppress(ResourceExistsError):
                await queue.create_queue()


async def _store_initial_placement(storage: Storage) -> None:
    """Store this configuration's placement unless one exists."""
    if await storage.read_placement_entity() is not None:
        return
    shards = storage.options.queue_shards or len(storage.account_ids)  # fixed once stored
    initial = Placement.initial(storage.account_ids, shards)
    async with storage.guard(renew=False):
        with suppress(ResourceExistsError):
            await storage.placement_table().create_entity(initial.to_entity())


async def _ensure_member_row(storage: Storage, client: TableClient) -> None:
    """Create the account's member row unless it exists."""
    if await control_get(storage, client, MEMBER_KEYS) is not None:
        return
    async with storage.guard(renew=False):
        with suppress(ResourceExistsError):
            await client.create_entity(_member_row(storage))


def _member_row(storage: Storage) -> dict[str, str]:
    partition_key, row_key = MEMBER_KEYS
    return {
        "PartitionKey": partition_key,
        "RowKey": row_key,
        "home": storage.account_ids[0],
        "id": uuid.uuid4().hex,
    }


async def missing_resources(storage: Storage) -> list[str]:
    """Names of tables and queues that do not exist (raises if storage is unreachable)."""
    missing: list[str] = []
    placement = storage.lease.current or await storage.refresh_placement()
    if placement is None:
        return ["placement"]  # (or storage is unreachable: that raises)
    in_use = min(len(placement.accounts), len(storage.account_ids))
    for index in range(in_use):  # an added account waits for its rebalance
        async with storage.guard(), storage.clients.service_client(index) as service:
            existing = {table.name async for table in service.list_tables()}
        wanted = [*TABLES, META_TABLE, *([PLACEMENT_TABLE] if index == 0 else [])]
        missing += [f"{name} (account {index})" for name in wanted if name not in existing]
    for queue in storage.all_queues():
        async with storage.guard():
            try:
                await queue.get_queue_properties()
            except HttpResponseError as error:
                if error.status_code != 404:
                    raise
                missing.append(queue.queue_name)
    return missing
