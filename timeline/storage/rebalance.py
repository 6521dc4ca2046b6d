"""``timeline rebalance``: move the partitions whose home changed when accounts were added.

Only the partitions that jump hashing sends to a new account move (about 1/N of them when
one account is added to N-1); nothing moves between the old accounts. The move goes in
``steps`` ranges of hash slots, each in five writes of the placement row:

1. **freeze** the step's slots: their moving partitions take reads (from the old home) but
   refuse writes with a retryable 503 / worker deferral. Then wait the *fence* ``F``: the
   longest lease plus the longest storage timeout any process has recorded (each records
   its own before it routes anything), plus a margin. After it, every process routes by a
   placement read after the freeze, and any write routed before it has landed, so the old
   home is final.
2. **copy** each moving partition of those slots (found by a key-only scan of the old
   accounts, made after the fence so partitions created meanwhile are included) to its new
   home with EGT upserts, then **verify**: the new home holds exactly the old rows (rows
   left there by an interrupted earlier run are deleted).
3. **flip** the slots to ``moved`` while still frozen, and wait ``F`` again: no process
   reads the old home any more, and both homes hold the same rows meanwhile.
4. **unfreeze**: writes resume, at the new home.
5. After the last step, delete the moved partitions' rows from the old homes, then write
   the placement *settled* on all accounts.

Every step is redone safely from what the placement row shows, so a rebalance that dies
is resumed by running it again (with the same account list): it first waits ``F`` (the run
that died may have just changed the row), then unfreezes ranges already flipped, then
goes on. A second rebalancer running at the same time fails on the placement row's ETag.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceModifiedError
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableClient
from tqdm import tqdm

from timeline.errors import ConfigurationError, TimelineError
from timeline.storage.accounts import Storage
from timeline.storage.calls import chunked, query_page
from timeline.storage.names import TABLES
from timeline.storage.placement import SLOTS, Placement, hash64, slot_of

log = logging.getLogger(__name__)


class RebalanceError(TimelineError):
    """A rebalance could not go on; running it again resumes where it stopped."""


@dataclass
class RebalanceReport:
    version: int
    accounts: int
    partitions: int = 0
    rows: int = 0
    removed: int = 0


@dataclass(frozen=True, slots=True)
class _Moving:
    table: str
    partition_key: str
    source: int
    target: int


class Rebalancer:
    """Moves partitions to their new homes, range by range, resumable after a kill.

    About 200 lines: the steps (freeze, copy, fence, flip, delete, settle) share the
    fence arithmetic and the progress row, and read best in order in one class."""

    def __init__(
        self,
        storage: Storage,
        *,
        margin_s: float = 30.0,
        steps: int = 8,
        progress: bool = True,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._storage = storage
        self._margin_s = margin_s
        self._steps = max(1, min(steps, SLOTS))
        self._progress = progress
        self._sleep = sleep
        self._etag = ""

    async def run(self) -> RebalanceReport:
        placement, resumed = await self._begin()
        report = RebalanceReport(placement.version, len(placement.accounts))
        if placement.settled:
            return report
        if resumed:
            placement = await self._resume(placement)
        ranges = [set(range(SLOTS)[step :: self._steps]) for step in range(self._steps)]
        with tqdm(total=SLOTS, unit="slot", desc="rebalance", disable=not self._progress) as bar:
            bar.update(len(placement.moved))
            for slots in ranges:
                pending = frozenset(slots - placement.moved)
                if pending:
                    placement = await self._move(placement, pending, report, bar)
        report.removed = await self._remove_moved_from_old_homes(placement)
        placement = await self._write(
            placement.next_version(previous=None, moved=frozenset(), frozen=frozenset())
        )
        report.version = placement.version
        log.info("placement version %d is settled on %d accounts", report.version, report.accounts)
        return report

    async def _begin(self) -> tuple[Placement, bool]:
        """Read the placement; start a move onto the configured accounts if it is settled.
        True with a move that an earlier run started."""
        placement = await self._read()
        configured = self._storage.account_ids
        if placement.settled and configured == placement.accounts:
            return placement, False
        if not placement.settled and configured != placement.accounts:
            raise ConfigurationError(
                f"a rebalance onto {list(placement.accounts)} is in progress: run it again "
                "with exactly those accounts to finish it"
            )
        await self._storage.create_all()  # the new accounts' tables
        if placement.settled:
            placement = await self._write(
                placement.next_version(accounts=configured, previous=len(placement.accounts))
            )
            log.info(
                "placement version %d: moving onto %d accounts", placement.version, len(configured)
            )
            return placement, False
        return placement, True

    async def _resume(self, placement: Placement) -> Placement:
        """Fence before anything else: the run that died may have changed the placement
        just before, and processes may still route by the version before that. Then let
        ranges that were flipped take writes again."""
        await self._fence(placement, "see the placement the interrupted run left")
        if placement.frozen & placement.moved:
            placement = await self._write(
                placement.next_version(frozen=placement.frozen - placement.moved)
            )
        return placement

    async def _move(
        self, placement: Placement, slots: frozenset[int], report: RebalanceReport, bar: tqdm[Any]
    ) -> Placement:
        placement = await self._write(placement.next_version(frozen=placement.frozen | slots))
        await self._fence(placement, "stop writing the partitions being copied")
        for moving in await self._moving_partitions(placement, slots):
            report.rows += await self._copy(moving)
            report.partitions += 1
            bar.set_postfix(partitions=report.partitions, rows=report.rows)
        placement = await self._write(placement.next_version(moved=placement.moved | slots))
        await self._fence(placement, "read the copied partitions from their new home")
        placement = await self._write(placement.next_version(frozen=placement.frozen - slots))
        bar.update(len(slots))
        return placement

    async def _fence(self, placement: Placement, why: str) -> None:
        """Wait until no process can route by an older placement and no request routed by
        one is still in flight: the longest lease and storage timeout any process has
        recorded (read now, after the change), plus the margin."""
        lease_s, timeout_s = await self._storage.lease.read_timing()
        fence_s = lease_s + timeout_s + self._margin_s
        log.info(
            "placement version %d: waiting %.1f s for every process to %s",
            placement.version,
            fence_s,
            why,
        )
        await self._sleep(fence_s)

    async def _moving_partitions(
        self, placement: Placement, slots: frozenset[int]
    ) -> list[_Moving]:
        """Every partition of these slots whose home changes, from key-only scans."""
        found: list[_Moving] = []
        for table in TABLES:
            for source in range(placement.previous or 0):
                for key in await self._partition_keys(source, table):
                    key_hash = hash64(key)
                    if (
                        placement.moving(key_hash)
                        and slot_of(key_hash) in slots
                        and placement.old_home(key_hash) == source
                    ):
                        found.append(_Moving(table, key, source, placement.new_home(key_hash)))
        return found

    async def _partition_keys(self, account: int, table: str) -> set[str]:
        """A key-only scan of one account's table, one bounded request per 1,000 rows."""
        client = self._storage.account_table(account, table)
        keys: set[str] = set()
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard():
                page = await query_page(
                    client, "", {}, select=["PartitionKey"], limit=1000, continuation=continuation
                )
            keys.update(entity["PartitionKey"] for entity in page.items)
            continuation = page.continuation
            if continuation is None:
                return keys

    async def _copy(self, moving: _Moving) -> int:
        """Copy one partition with EGT upserts and check the copy row for row."""
        source = self._storage.account_table(moving.source, moving.table)
        target = self._storage.account_table(moving.target, moving.table)
        rows = await self._rows(source, moving.partition_key)
        for chunk in chunked(rows.values()):
            await self._transact(
                target, [("upsert", row, {"mode": UpdateMode.REPLACE}) for row in chunk]
            )
        copied = await self._rows(target, moving.partition_key)
        strays = [copied[key] for key in copied.keys() - rows.keys()]
        for chunk in chunked(strays):
            await self._transact(target, [("delete", row) for row in chunk])
        if any(copied[key] != row for key, row in rows.items() if key in copied) or (
            rows.keys() - copied.keys()
        ):
            raise RebalanceError(
                f"the copy of {moving.table}/{moving.partition_key} differs from its source"
            )
        return len(rows)

    async def _rows(self, client: TableClient, partition_key: str) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard():
                page = await query_page(
                    client,
                    "PartitionKey eq @pk",
                    {"pk": partition_key},
                    select=None,
                    limit=1000,
                    continuation=continuation,
                )
            rows.update((entity["RowKey"], dict(entity)) for entity in page.items)
            continuation = page.continuation
            if continuation is None:
                return rows

    async def _transact(self, client: TableClient, operations: list[Any]) -> None:
        async with self._storage.guard():
            await client.submit_transaction(operations)

    async def _remove_moved_from_old_homes(self, placement: Placement) -> int:
        """Delete what the old homes still hold of moved partitions (no process reads it)."""
        removed = 0
        for table in TABLES:
            for source in range(placement.previous or 0):
                client = self._storage.account_table(source, table)
                for key in await self._partition_keys(source, table):
                    if placement.old_home(hash64(key)) != placement.new_home(hash64(key)):
                        rows = await self._rows(client, key)
                        for chunk in chunked(rows.values()):
                            await self._transact(client, [("delete", row) for row in chunk])
                        removed += len(rows)
        return removed

    async def _read(self) -> Placement:
        entity = await self._storage.read_placement_entity()
        if entity is None:
            raise ConfigurationError("storage has no placement yet: run `timeline init` first")
        self._etag = str(entity.metadata["etag"])
        return Placement.from_entity(entity)

    async def _write(self, placement: Placement) -> Placement:
        """Replace the placement row, only if nobody else changed it since it was read."""
        async with self._storage.guard():
            try:
                metadata = await self._storage.placement_table().update_entity(
                    placement.to_entity(),
                    mode=UpdateMode.REPLACE,
                    etag=self._etag,
                    match_condition=MatchConditions.IfNotModified,
                )
            except ResourceModifiedError:
                raise RebalanceError(
                    "the placement changed under this rebalance: is another one running?"
                ) from None
        self._etag = metadata["etag"]
        return placement
