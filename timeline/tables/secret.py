"""The HMAC key every API process and admin command signs with, created once in storage."""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from timeline.errors import StorageUnavailableError
from timeline.retry import backoff_delay
from timeline.storage.accounts import Storage

log = logging.getLogger(__name__)

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
        except ResourceNotFoundError:  # no table yet
            raise StorageUnavailableError(
                "storage is not initialised: run `timeline init`", retry_after=5
            ) from None
    return str(created["value"]).encode()


async def wait_for_auth_secret(
    storage: Storage, configured: str | None, legacy_file: Path | None = None
) -> bytes:
    """``auth_secret``, retried with backoff while storage is unreachable or not yet
    initialised: a process started before its storage waits instead of crashing."""
    attempt = 0
    while True:
        try:
            return await auth_secret(storage, configured, legacy_file)
        except StorageUnavailableError as error:
            attempt += 1
            log.warning("waiting for storage to read the auth secret: %s", error.message)
            await asyncio.sleep(backoff_delay(attempt, base=0.5, cap=10))


def _read(path: Path | None) -> str:
    return path.read_text().strip() if path is not None and path.is_file() else ""
