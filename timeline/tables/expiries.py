"""The ``expiries`` table: a time index of the auxiliary rows that must end (idempotency keys,
rate-limit windows, mutes and filters with an expiry) and of readers' dormancy checks, so a
sweep finds them without scanning the partitions they live in.

An index row is written *before* the row it names (an upsert with a key derived from that
row's keys, so writing it twice is one row): a process that dies between the two leaves an
index row naming nothing, which the sweep drops; never a row nobody will remove.

Keys: ``PartitionKey`` is ``{group}{bucket}-{shard}``, where the bucket is a minute of Unix
time (a second for dormancy checks, ``CHECK_BUCKET_S``), zero-padded so keys sort by time,
and the shard (a hash of the named row's partition, ``SHARDS`` of them) spreads one bucket's
index rows over partitions, so a busy minute is not one hot partition. Group ``d`` holds
rows filed by when they are *due* (their end is stored on the row itself: a key's record
expiry, a rate-limit window's end); group ``a`` reader dormancy checks, by due time.
``RowKey`` is the SHA-256 of the named row's table and keys; the row holds them as
``table``, ``pk``, ``rk`` and its ``kind``.

Index partitions are placed like any other (``timeline.storage.placement``), so a
rebalance moves them; a shard whose partition a rebalance has frozen is skipped for the
next one, so a rebalance never blocks the writes that file rows here.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from timeline.model.entities import Page
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, submit_batch
from timeline.storage.names import EXPIRIES
from timeline.storage.placement import hash64
from timeline.tables.rows import delete_entity

BUCKET_S = 60
"""Seconds of time one bucket covers (group ``d``)."""
CHECK_BUCKET_S = 1
"""Seconds one bucket of dormancy checks (group ``a``) covers: a check is swept at most this
(plus the sweep interval) late, so even an inactive period of seconds starts on time. Checks
are due at stamp-period boundaries, so finer buckets do not spread them over more partitions.
Checks filed in minute buckets before sort below every second bucket: swept early, they are
judged from the stamp and re-filed at their due time."""
SHARDS = 16
"""Index partitions per bucket and group."""
DUE, ACTIVITY = "d", "a"
IDEMPOTENCY, RATE_LIMIT = "idempotency", "rate"
MUTE, FILTER = "mute", "filter"
"""A mute or keyword filter with an expiry (``timeline.tables.relations``), filed by when it
is due."""
DORMANCY = "dormancy"
"""A reader's dormancy check (``timeline.tables.activity``), filed by when it is due in group
``a``: swept without the grace the other groups wait, since it names no row in flight."""
KINDS = {
    IDEMPOTENCY: DUE,
    RATE_LIMIT: DUE,
    MUTE: DUE,
    FILTER: DUE,
    DORMANCY: ACTIVITY,
}
"""Each kind of auxiliary row and the group it is filed in."""
_DUE_RANGE = "PartitionKey ge @low and PartitionKey lt @high"


@dataclass(frozen=True, slots=True)
class Expiry:
    """One index row: the row it names, its kind, and its own keys."""

    kind: str
    table: str
    pk: str
    rk: str
    index_pk: str
    index_rk: str


def bucket_seconds(group: str) -> int:
    """Seconds one bucket of ``group`` covers."""
    return CHECK_BUCKET_S if group == ACTIVITY else BUCKET_S


def bucket_key(group: str, moment: float) -> str:
    """The sortable prefix of every index partition of ``group`` for ``moment``."""
    return f"{group}{int(moment // bucket_seconds(group)):010d}"


class ExpiriesRepository:
    """Files auxiliary rows by time, lists the due ones, and drops an index row."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def note(
        self, kind: str, table: str, pk: str, rk: str, *, at: float | None = None
    ) -> None:
        """File a row before it is written: ``at`` is when it is due (default: now)."""
        moment = time.time() if at is None else at
        prefix = bucket_key(KINDS[kind], moment)
        row = {
            "PartitionKey": self._writable_shard(prefix, pk),
            "RowKey": index_row_key(table, pk, rk),
            "kind": kind,
            "table": table,
            "pk": pk,
            "rk": rk,
        }
        await submit_batch(self._storage, EXPIRIES, row["PartitionKey"], [("upsert", row)])

    def _writable_shard(self, prefix: str, pk: str) -> str:
        """The named row's shard, or the next one a rebalance has not frozen."""
        placement = self._storage.lease.routable()
        first = hash64(pk) % SHARDS
        candidates = [f"{prefix}-{(first + step) % SHARDS:02d}" for step in range(SHARDS)]
        for candidate in candidates:
            if placement.writable(hash64(candidate)):
                return candidate
        return candidates[0]  # every shard frozen: the write fails with a retryable 503

    async def due_page(
        self, account: int, group: str, before: float, continuation: dict[str, str] | None
    ) -> Page[Expiry]:
        """One page of one account's index rows of ``group`` filed before ``before`` (a
        range of partition keys: the table's own order), those whose home is elsewhere
        left out (a stale copy a running rebalance removes)."""
        client = self._storage.account_table(account, EXPIRIES)
        parameters = {"low": group, "high": bucket_key(group, before)}
        async with self._storage.guard(kind="query-1000"):
            page = await query_page(
                client, _DUE_RANGE, parameters, select=None, limit=1000, continuation=continuation
            )
        placement = self._storage.lease.routable()
        rows = [
            Expiry(
                str(row["kind"]),
                str(row["table"]),
                str(row["pk"]),
                str(row["rk"]),
                str(row["PartitionKey"]),
                str(row["RowKey"]),
            )
            for row in page.items
            if placement.home(hash64(row["PartitionKey"])) == account
        ]
        return Page(rows, page.continuation)

    async def drop(self, expiry: Expiry) -> None:
        """Delete the index row (gone already: fine)."""
        await delete_entity(self._storage, EXPIRIES, expiry.index_pk, expiry.index_rk)


def filed_at(expiry: Expiry) -> float:
    """The start (Unix seconds) of the bucket an index row is filed in."""
    return float(int(expiry.index_pk[1:11]) * bucket_seconds(expiry.index_pk[0]))


def index_row_key(table: str, pk: str, rk: str) -> str:
    """The index row's key for one named row: the same however often it is filed."""
    return hashlib.sha256("\x00".join((table, pk, rk)).encode()).hexdigest()
