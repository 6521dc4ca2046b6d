"""The HMAC key every API process and admin command signs with, created once in storage."""

from __future__ import annotations

import secrets

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from timeline.storage import Storage

SECRET_KEYS = ("secret", "auth")


async def auth_secret(storage: Storage, configured: str | None) -> bytes:
    """The configured secret, else the one in the placement home's ``timelineMeta`` table.

    The first process to find none creates it with an insert; a concurrent one's insert
    fails and it reads the winner's, so every process on every host signs with one key.
    """
    if configured:
        return configured.encode()
    client = storage.meta_table()
    async with storage.guard():
        try:
            return str((await client.get_entity(*SECRET_KEYS))["value"]).encode()
        except ResourceNotFoundError:
            pass
    partition_key, row_key = SECRET_KEYS
    created = {"PartitionKey": partition_key, "RowKey": row_key, "value": secrets.token_urlsafe(32)}
    async with storage.guard():
        try:
            await client.create_entity(created)
        except ResourceExistsError:
            return str((await client.get_entity(*SECRET_KEYS))["value"]).encode()
    return str(created["value"]).encode()
