"""The HMAC keys every API process and admin command signs with, kept in the placement
home's ``timelineMeta`` table: the data key (row ``secret``/``auth``, created once, never
rotated) and the bearer-token key ring (partition ``keyring``, one row per key id).

The ring's newest key signs new tokens; every key in it verifies them. ``rotate_key`` adds a
newer key (processes sign with it once they reload the ring); ``retire_key`` deletes an older
one (its tokens stop verifying once processes reload). The first ring is key ``1``, a copy
of the data key, as with a configured secret: a deployment that unsets
``TIMELINE_AUTH_SECRET`` over that same secret stored keeps its tokens valid.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.model.tokens import FIRST_KEY_ID, KeyRing
from timeline.retry import backoff_delay
from timeline.storage.accounts import Storage

log = logging.getLogger(__name__)

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
    value = secrets.token_urlsafe(32)
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
    return value.encode()


async def wait_for_key_ring(storage: Storage, configured: str | None) -> KeyRing:
    """``load_key_ring``, retried with backoff while storage is unreachable or not yet
    initialised: a process started before its storage waits instead of crashing."""
    attempt = 0
    while True:
        try:
            return await load_key_ring(storage, configured)
        except StorageUnavailableError as error:
            attempt += 1
            log.warning("waiting for storage to read the key ring: %s", error.message)
            await asyncio.sleep(backoff_delay(attempt, base=0.5, cap=10))


KEYRING = "keyring"


@dataclass(frozen=True, slots=True)
class StoredKey:
    key_id: str
    created: datetime | None


def _row_key(key_id: str) -> str:
    return f"{int(key_id):09d}"


async def load_key_ring(storage: Storage, configured: str | None) -> KeyRing:
    """The key ring: a configured secret alone (key ``1``, not rotatable), else the stored
    ring, created as key ``1`` = the data key the first time (an insert: concurrent
    processes agree on the winner's)."""
    if configured:
        return KeyRing.single(configured.encode())
    data_key = await auth_secret(storage, None)
    rows = await _ring_rows(storage)
    if not rows:
        first = {"PartitionKey": KEYRING, "RowKey": _row_key(FIRST_KEY_ID)}
        async with storage.guard():
            with suppress(ResourceExistsError):
                await storage.meta_table().create_entity({**first, "value": data_key.decode()})
        rows = await _ring_rows(storage)
    keys = {str(int(row["RowKey"])): str(row["value"]).encode() for row in rows}
    return KeyRing(keys, str(int(rows[-1]["RowKey"])), data_key)


async def _ring_rows(storage: Storage) -> list[Any]:
    """The ring's rows, oldest key first (one small partition: one query)."""
    async with storage.guard():
        try:
            rows = storage.meta_table().query_entities(
                "PartitionKey eq @pk", parameters={"pk": KEYRING}
            )
            return sorted([row async for row in rows], key=lambda row: str(row["RowKey"]))
        except ResourceNotFoundError:  # no table yet
            raise StorageUnavailableError(
                "storage is not initialised: run `timeline init`", retry_after=5
            ) from None


async def list_keys(storage: Storage) -> list[StoredKey]:
    """The stored ring's key ids, oldest first (the last one signs new tokens)."""
    return [
        StoredKey(str(int(row["RowKey"])), row.metadata.get("timestamp"))
        for row in await _ring_rows(storage)
    ]


async def rotate_key(storage: Storage, configured: str | None) -> str:
    """Add a new key to the ring and return its id: it signs every token minted after the
    API processes reload the ring; tokens of older keys stay valid until those are retired."""
    _refuse_configured(configured)
    await load_key_ring(storage, None)
    while True:
        newest = int((await _ring_rows(storage))[-1]["RowKey"])
        key_id = str(newest + 1)
        row = {"PartitionKey": KEYRING, "RowKey": _row_key(key_id)}
        async with storage.guard():
            try:
                await storage.meta_table().create_entity(
                    {**row, "value": secrets.token_urlsafe(32)}
                )
                return key_id
            except ResourceExistsError:
                continue  # another rotation took this id: take the next


async def retire_key(storage: Storage, configured: str | None, key_id: str) -> None:
    """Delete an older key: tokens it signed stop verifying once processes reload the ring.
    The newest key cannot be retired (rotate first), so the ring is never empty."""
    _refuse_configured(configured)
    if not key_id.isascii() or not key_id.isdigit() or len(key_id) > 9 or int(key_id) < 1:
        raise ConfigurationError(f"no key {key_id!r} in the ring")
    rows = await _ring_rows(storage)
    ids = [str(int(row["RowKey"])) for row in rows]
    if str(int(key_id)) not in ids:
        raise ConfigurationError(f"no key {key_id!r} in the ring (keys: {', '.join(ids)})")
    if str(int(key_id)) == ids[-1]:
        raise ConfigurationError(
            f"key {key_id} signs new tokens: run `timeline secret rotate` before retiring it"
        )
    async with storage.guard():
        with suppress(ResourceNotFoundError):
            await storage.meta_table().delete_entity(KEYRING, _row_key(key_id))


def _refuse_configured(configured: str | None) -> None:
    if configured:
        raise ConfigurationError(
            "TIMELINE_AUTH_SECRET is set, so it is the only key: unset it to use the stored "
            "key ring (docs/security.md)"
        )
