"""The end of every auxiliary row: the worker's sweep of the ``expiries`` index.

Every round reads, on each account, the index rows that are due (an idempotency key, a
rate-limit window or a mute past its stored end, plus ``GRACE_S``; a reader's dormancy
check at its time); for each it judges the row it names from storage, deletes it only when
it can no longer matter (each delete on the condition that the row is unchanged since read:
a key reused or a window reopened meanwhile is a new row, filed anew), then deletes the
index row. Nothing is decided from memory.

Two sweepers, or one killed between any two calls, only repeat work: every delete is of a
row that is due either way, or conditional on the etag read, and a missing row is fine.
A row a rebalance has frozen refuses the delete (a retryable error), so its index row
stays for the next round: no delete ever lands on a partition being copied.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from contextlib import suppress
from dataclasses import dataclass

from azure.core.exceptions import HttpResponseError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity

from fanout_worker.metrics import OLDEST_DUE
from timeline.delivery.dormancy import Dormancy
from timeline.errors import StorageUnavailableError
from timeline.model.idempotency import is_live
from timeline.storage.accounts import Storage
from timeline.storage.names import TABLES
from timeline.tables.expiries import (
    ACTIVITY,
    DORMANCY,
    DUE,
    FILTER,
    IDEMPOTENCY,
    MUTE,
    RATE_LIMIT,
    ExpiriesRepository,
    Expiry,
    filed_at,
)
from timeline.tables.rows import if_unchanged

log = logging.getLogger(__name__)

GRACE_S = 120.0
"""Past its due time, how long an index row waits more: longer than any one storage call
(the one that writes the named row after its index row) can still be landing."""
MAX_ROWS = 20_000
"""Index rows one round handles at most per account and group (the next round takes the
rest): each has its own budget, so a steady inflow of one group starves neither the other
nor a later account."""
_AT_ONCE = 16


@dataclass
class SweepReport:
    removed: int = 0
    """Named rows deleted."""
    dropped: int = 0
    """Index rows deleted."""
    deferred: int = 0
    """Index rows left for a later round (storage refused, e.g. a partition moving)."""


class Sweeper:
    """Removes what ``expiries`` says is due, judging each row from storage."""

    def __init__(self, storage: Storage, *, dormancy: Dormancy | None = None) -> None:
        self._storage = storage
        self._expiries = ExpiriesRepository(storage)
        self._dormancy = dormancy

    async def run(self, stopping: asyncio.Event, interval_s: float) -> None:
        """Sweep every ``interval_s`` (jittered, so several workers drift apart) until
        ``stopping``; a round that fails is logged and the next one tries again."""
        while not stopping.is_set():
            try:
                report = await self.sweep()
                if report.dropped or report.deferred:
                    log.info("expiry sweep: %s", report)
            except (StorageUnavailableError, HttpResponseError) as error:
                log.warning("expiry sweep failed: %s", error)
            with suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), interval_s * random.uniform(0.5, 1.5))  # noqa: S311

    async def sweep(self, *, now: float | None = None) -> SweepReport:
        """One round over every account: every due index row (up to ``MAX_ROWS`` per account
        and group)."""
        moment = time.time() if now is None else now
        report = SweepReport()
        groups = [DUE]
        if self._dormancy is not None and self._dormancy.enabled:
            groups.append(ACTIVITY)  # with it off, checks wait untouched for it to be on
        for group in groups:
            grace = 0.0 if group == ACTIVITY else GRACE_S  # a check names no write in flight
            before = moment - grace
            oldest = 0.0
            for account in range(len(self._storage.account_ids)):
                filed = await self._sweep_group(account, group, before, moment, report)
                if filed is not None:
                    oldest = max(oldest, moment - filed)
            OLDEST_DUE.labels(group=group).set(oldest)
        return report

    async def _sweep_group(
        self, account: int, group: str, before: float, now: float, report: SweepReport
    ) -> float | None:
        """Sweep one account's due rows of ``group``; returns when the oldest was filed."""
        continuation: dict[str, str] | None = None
        handled, oldest = 0, None
        while handled < MAX_ROWS:
            page = await self._expiries.due_page(account, group, before, continuation)
            if oldest is None and page.items:
                oldest = filed_at(page.items[0])  # pages come in key order: oldest first
            items = random.sample(page.items, len(page.items))  # workers part ways in a page
            for start in range(0, len(items), _AT_ONCE):
                chunk = items[start : start + _AT_ONCE]
                await asyncio.gather(*(self._settle(expiry, now, report) for expiry in chunk))
            handled += len(items)
            continuation = page.continuation
            if continuation is None:
                break
        return oldest

    async def _settle(self, expiry: Expiry, now: float, report: SweepReport) -> None:
        """Remove the named row if it can no longer matter, then its index row (a dormancy
        check: judge the reader, ``timeline.delivery.dormancy``)."""
        try:
            if expiry.kind == DORMANCY:
                if self._dormancy is None or not await self._dormancy.check(expiry.pk, now):
                    report.deferred += 1
                    return
            elif await self._remove(expiry, now):
                report.removed += 1
            await self._expiries.drop(expiry)
            report.dropped += 1
        except StorageUnavailableError:
            report.deferred += 1

    async def _remove(self, expiry: Expiry, now: float) -> bool:
        if expiry.table not in TABLES:
            log.warning("an expiry names an unknown table: %r", expiry)
            return False
        row = await self._read(expiry)
        if row is None or not _removable(expiry.kind, row, now):
            return False
        return await self._delete(expiry, row)

    async def _read(self, expiry: Expiry) -> TableEntity | None:
        async with self._storage.guard(kind="read"):
            client = self._storage.reader(expiry.table, expiry.pk)
            try:
                return await client.get_entity(expiry.pk, expiry.rk)
            except ResourceNotFoundError:
                return None

    async def _delete(self, expiry: Expiry, read: TableEntity) -> bool:
        """Delete the named row, only if unchanged since ``read``."""
        condition = if_unchanged(read)
        async with self._storage.guard(kind="write-1"):
            client = self._storage.table(expiry.table, expiry.pk)
            try:
                await client.delete_entity(expiry.pk, expiry.rk, **condition)
            except (ResourceNotFoundError, ResourceModifiedError):
                return False
        return True


def _removable(kind: str, row: TableEntity, now: float) -> bool:
    """Whether a named row, as read, can no longer matter."""
    if kind == IDEMPOTENCY:
        return not is_live(row, now)
    if kind == RATE_LIMIT:
        return float(row.get("expires_at") or 0) <= now
    if kind in (MUTE, FILTER):  # a mute made again without an expiry stays
        return row.get("expires_at") is not None and float(row["expires_at"]) <= now
    return False
