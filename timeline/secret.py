"""The HMAC key every API process and admin command signs with, created once in storage."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from timeline.storage import Storage

SECRET_KEYS = ("secret", "auth")


async def auth_secret(
    storage: Storage, configured: str | None, legacy_file: Path | None = None
) -> bytes:
    """The configured secret, else the one in the placement home's ``timelineMeta`` table.

    The first process to find none creates it with an insert; a concurrent one's insert
    fails and it reads the winner's, so every process on every host signs with one key. A
    secret file an earlier version kept under the data directory (``legacy_file``) becomes
    the stored secret, so tokens it signed stay valid.
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
    value = (await asyncio.to_thread(_read, legacy_file)) or secrets.token_urlsafe(32)
    created = {"PartitionKey": partition_key, "RowKey": row_key, "value": value}
    async with storage.guard():
        try:
            await client.create_entity(created)
        except ResourceExistsError:
            return str((await client.get_entity(*SECRET_KEYS))["value"]).encode()
    return str(created["value"]).encode()


def _read(path: Path | None) -> str:
    return path.read_text().strip() if path is not None and path.is_file() else ""
