"""Files the auxiliary rows written before the ``expiries`` index existed (by the previous
version, or by a process not yet upgraded during a rolling upgrade), so the sweep ends them
too: request claims and void posts (filed as created now, so they live a whole claim
lifetime from the filing), idempotency key rows and rate-limit windows (filed at their
stored end). Run once after the upgrade has finished (``timeline file-expiries``).

Filing is an upsert of the index row before anything else, so running it twice, or
concurrently with the API and the workers (which file their own rows), is harmless; a
row filed that has meanwhile ended is found missing by the sweep and its index row dropped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableEntity

from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page
from timeline.storage.names import POSTS, RATE_LIMITS, SUBJECT_FOLLOWERS
from timeline.tables.expiries import CLAIM, IDEMPOTENCY, RATE_LIMIT, VOID, ExpiriesRepository
from timeline.tables.follows import claim_row_key
from timeline.tables.posts import KEY_ROWS

_RANGE = "RowKey ge @low and RowKey lt @high"
_VOID = "void eq @void"
_WINDOW = "RowKey eq @window"


@dataclass(frozen=True, slots=True)
class _Scan:
    """One kind of row to file: where it lives, how to find it, when it is due."""

    kind: str
    table: str
    query: str
    parameters: dict[str, Any]
    due_field: str | None
    """The stored end (Unix seconds) for rows filed by due time; None: filed as created now."""


def _prefix_range(prefix: str) -> dict[str, Any]:
    return {"low": prefix, "high": prefix[:-1] + chr(ord(prefix[-1]) + 1)}


SCANS = (
    _Scan(CLAIM, SUBJECT_FOLLOWERS, _RANGE, _prefix_range(claim_row_key("")), None),
    _Scan(VOID, POSTS, _VOID, {"void": True}, None),
    _Scan(IDEMPOTENCY, POSTS, _RANGE, _prefix_range(KEY_ROWS), "idem_expires"),
    _Scan(RATE_LIMIT, RATE_LIMITS, _WINDOW, {"window": "window"}, "expires_at"),
)


async def file_existing(storage: Storage) -> dict[str, int]:
    """File every auxiliary row on every account; returns how many of each kind."""
    expiries = ExpiriesRepository(storage)
    filed = {scan.kind: 0 for scan in SCANS}
    for scan in SCANS:
        async for row in _rows(storage, scan):
            at = None if scan.due_field is None else float(row.get(scan.due_field) or 0)
            pk, rk = str(row["PartitionKey"]), str(row["RowKey"])
            await expiries.note(scan.kind, scan.table, pk, rk, at=at)
            filed[scan.kind] += 1
    return filed


async def _rows(storage: Storage, scan: _Scan) -> AsyncIterator[TableEntity]:
    """Every row the scan matches, account by account, page by page."""
    for account in range(len(storage.account_ids)):
        client = storage.account_table(account, scan.table)
        continuation: dict[str, str] | None = None
        while True:
            async with storage.guard(kind="query-1000"):
                page = await query_page(
                    client,
                    scan.query,
                    scan.parameters,
                    select=None,
                    limit=1000,
                    continuation=continuation,
                )
            for row in page.items:
                yield row
            continuation = page.continuation
            if continuation is None:
                break
