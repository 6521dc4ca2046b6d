"""The placement lease: which placement this process routes by, and until when.

See ``timeline.storage.placement`` for why routing stops when the last read of the placement
is older than its lease. Before the first read counts, the configured accounts are checked
against their member rows and this process's timing is recorded beside the placement.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from contextlib import suppress
from typing import TYPE_CHECKING

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableEntity, UpdateMode
from azure.data.tables.aio import TableClient

from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.storage.clients import CONTROL
from timeline.storage.placement import PLACEMENT_KEYS, Placement

if TYPE_CHECKING:
    from timeline.storage.accounts import Storage

log = logging.getLogger(__name__)

MEMBER_KEYS = ("member", "placement")
TIMING_KEYS = ("placement", "timing")
"""Beside the placement row: the longest lease and storage timeout of any process."""


async def control_get(
    storage: Storage, client: TableClient, keys: tuple[str, str]
) -> TableEntity | None:
    async with storage.guard(renew=False):
        try:
            return await client.get_entity(*keys)
        except ResourceNotFoundError:
            return None  # the row, or its table (a fresh account), does not exist


class PlacementLease:
    """The stored placement this process last read, valid for ``placement_lease_s`` from
    when that read started; a refresher re-reads it every third of the lease."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._options = storage.options
        self.current: Placement | None = None
        """The placement last read (None: none stored, or none read yet)."""
        self._confirmed = False
        """The account list has passed the membership check and this process's timing is
        recorded; both once per process, before it routes anything."""
        self._valid_until = -math.inf
        self.refused: str | None = None
        """Why this configuration may not route (it does not match the stored placement)."""
        self._renewing = asyncio.Lock()
        self._refresher: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None

    @property
    def placement(self) -> Placement:
        """The stored placement this process routes by (``StorageUnavailableError`` when it
        has none: storage not initialised, or not reachable since the process started)."""
        if self.current is None:
            raise StorageUnavailableError(
                "the storage placement has not been read yet (is storage initialised? "
                "`timeline init`)",
                retry_after=2,
            )
        return self.current

    async def refresh(self) -> Placement | None:
        """Read the stored placement; the lease counts from when the read started.

        The first time, the accounts are checked and this process's timing recorded
        *before* that read, so no placement is routed by until a rebalance can see how long
        this process may keep routing by it."""
        storage = self._storage
        try:
            if not self._confirmed and not await self._confirm():
                self.current = None  # not initialised: `create_all` stores one
                return None
            started = time.monotonic()
            entity = await control_get(storage, storage.placement_table(), PLACEMENT_KEYS)
            if entity is None:
                self.current = None
                return None
            stored = Placement.from_entity(entity)
            stored.check_configured(storage.account_ids, self._options.queue_shards)
        except ConfigurationError as error:
            if self.refused is None:
                log.error("not routing storage requests: %s", error.message)
            self.refused = error.message
            return None
        self.refused = None
        if started + self._options.placement_lease_s > self._valid_until:  # not an older read
            self.current, self._valid_until = stored, started + self._options.placement_lease_s
        return self.current

    async def _confirm(self) -> bool:
        """Check the accounts and record this process's timing, once; False when storage
        holds no placement yet. Only the accounts the placement uses are checked here: an
        added one (unreachable, perhaps) is checked by ``create_all`` when it comes in."""
        storage = self._storage
        entity = await control_get(storage, storage.placement_table(), PLACEMENT_KEYS)
        if entity is None:
            await self.check_membership()  # a misordered list finds no placement first
            return False
        stored = Placement.from_entity(entity)
        stored.check_configured(storage.account_ids, self._options.queue_shards)
        await self.check_membership(len(stored.accounts))
        await self._record_timing()
        self._confirmed = True
        return True

    async def read_timing(self) -> tuple[float, float]:
        """The longest placement lease and storage timeout any process has recorded."""
        entity = await control_get(self._storage, self._storage.placement_table(), TIMING_KEYS)
        if entity is None:
            return self._options.placement_lease_s, self._options.timeout_s
        return float(entity["lease_s"]), float(entity["timeout_s"])

    async def check_membership(self, accounts: int | None = None) -> None:
        """Raise ``ConfigurationError`` for an account (of the first ``accounts``) that
        belongs to another placement home, or that is listed twice under two spellings (the
        same member row twice)."""
        storage = self._storage
        home, seen = storage.account_ids[0], set[str]()
        for index, account in enumerate(storage.clients.tables[:accounts]):
            member = await control_get(storage, account[CONTROL], MEMBER_KEYS)
            if member is None:
                continue  # an added account whose rebalance has not started yet
            if member["home"] != home:
                raise ConfigurationError(
                    f"storage account {storage.account_ids[index]} belongs to the placement "
                    f"whose home is {member['home']}, but the first configured account is "
                    f"{home}: list the accounts in the stored order"
                )
            if member["id"] in seen:
                raise ConfigurationError(
                    f"storage account {storage.account_ids[index]} is listed twice (under two "
                    "connection strings)"
                )
            seen.add(member["id"])

    async def _record_timing(self) -> None:
        """Raise the stored lease and timeout to this process's, before it routes anything:
        a rebalance's fence must outlast the longest of any process."""
        client = self._storage.placement_table()
        for _ in range(10):
            async with self._storage.guard(renew=False):
                try:
                    row = await client.get_entity(*TIMING_KEYS)
                except ResourceNotFoundError:
                    row = None
            lease, timeout = self._options.placement_lease_s, self._options.timeout_s
            if row is not None and row["lease_s"] >= lease and row["timeout_s"] >= timeout:
                return
            entity = {
                "PartitionKey": TIMING_KEYS[0],
                "RowKey": TIMING_KEYS[1],
                "lease_s": max(lease, float(row["lease_s"]) if row else 0.0),
                "timeout_s": max(timeout, float(row["timeout_s"]) if row else 0.0),
            }
            async with self._storage.guard(renew=False):
                try:
                    if row is None:
                        await client.create_entity(entity)
                    else:
                        await client.update_entity(
                            entity,
                            mode=UpdateMode.REPLACE,
                            etag=row.metadata["etag"],
                            match_condition=MatchConditions.IfNotModified,
                        )
                    return
                except (ResourceExistsError, ResourceModifiedError):
                    continue
        raise StorageUnavailableError("could not record this process's timing", retry_after=2)

    async def _refresh_forever(self) -> None:
        period = self._options.placement_lease_s / 3
        while True:
            try:
                await self.refresh()
                await asyncio.sleep(period)
            except Exception as error:  # the refresher must outlive any one failure
                log.warning("could not read the placement: %s", type(error).__name__)
                await asyncio.sleep(min(1.0, period))

    async def renew_if_expired(self) -> None:
        """Re-read the placement now if this process may not route by the one it has (a
        stalled event loop can starve the refresher past the lease)."""
        if self.current is not None and time.monotonic() <= self._valid_until:
            return
        async with self._renewing:
            if self.current is not None and time.monotonic() <= self._valid_until:
                return
            with suppress(StorageUnavailableError):
                await self.refresh()

    def routable(self) -> Placement:
        """The placement, if this process may route by it now."""
        if self.refused is not None:
            raise StorageUnavailableError(self.refused, retry_after=60)
        placement = self.placement
        if time.monotonic() > self._valid_until:
            raise StorageUnavailableError(
                "the storage placement could not be confirmed recently", retry_after=2
            )
        return placement
