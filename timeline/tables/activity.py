"""Reader activity and dormancy: the rows that let fan-out skip readers who are gone.

Two head rows of the reader's own ``timelines`` partition (keys before ``!m-``, so the home
read's head query returns them at no extra cost):

- ``!a``, the activity stamp: the last period number (``Inactivity.granularity_s``) in which
  the reader read its timeline or opened a stream; rewritten only when older than the
  current one, so activity costs at most one write per period (a day at most).
- ``!d``, the dormancy marker: written by the sweep that finds the stamp too old, before it
  flags anything; ``state`` is ``dormant`` until a read asks for the wake (``waking``), and
  the wake deletes it last. ``gen`` names one dormancy.

A dormant reader's follow rows in ``subjectFollowers`` carry ``inactive`` (the marker's
generation) and ``inactive_from`` (its ``since``): the post fan-out skips them for posts made
from then on, which are exactly the posts the wake copies back; deletes, purges and trims
never skip them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.storage.accounts import Storage
from timeline.storage.calls import failed_index, query_page, submit_batch, transact
from timeline.storage.names import SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES
from timeline.tables.expiries import DORMANCY, ExpiriesRepository
from timeline.tables.follows import INACTIVE, INACTIVE_FROM
from timeline.tables.rows import (
    LISTING,
    META,
    create_entity,
    delete_entity,
    etag,
    get_entity,
    if_unchanged,
)

STAMP_ROW, CURSOR_ROW, MARKER_ROW = "!a", "!c", "!d"
STAMP, GENERATION, STATE, WAKE_AT, SINCE = "stamp", "gen", "state", "wake_at", "since"
FLAG, FLAG_FROM = INACTIVE, INACTIVE_FROM
DORMANT, WAKING = "dormant", "waking"
RESTORED = "restored"
HEAD_SELECT = [STAMP, GENERATION, STATE, WAKE_AT, SINCE, RESTORED]
"""The properties of the activity rows a head query must select beside a post's."""
_HEAD = "PartitionKey eq @pk and RowKey ge @low and RowKey le @high"
_END_TRIES = 5
"""Deletes of the marker tried against fresh reads (each retry follows a read's resend,
at most one per resend period): the message is redelivered if all fail."""
DAY_S = 86_400.0
STAMPS_PER_PERIOD = 8
"""A stamp's granularity is an eighth of the inactive period (at most a day): a reader is
judged inactive at most that late."""


@dataclass(frozen=True, slots=True)
class Inactivity:
    """How long without reading makes a reader inactive (0: never)."""

    period_s: float = 0.0

    @classmethod
    def days(cls, days: float) -> Inactivity:
        return cls(days * DAY_S)

    @property
    def enabled(self) -> bool:
        return self.period_s > 0

    @property
    def granularity_s(self) -> float:
        return min(DAY_S, self.period_s / STAMPS_PER_PERIOD)

    def stamp(self, now: float | None = None) -> int:
        """The period number of ``now``: what the stamp holds after activity."""
        return int((time.time() if now is None else now) // self.granularity_s)

    def due(self, stamp: int) -> float:
        """When a reader last stamped in ``stamp`` becomes inactive (at the latest)."""
        return (stamp + 1) * self.granularity_s + self.period_s


@dataclass(frozen=True, slots=True)
class Head:
    """A reader's activity rows as read: the stamp (None: never stamped) and the marker."""

    stamp: int | None = None
    stamp_row: TableEntity | None = None
    marker: TableEntity | None = None
    cursor: TableEntity | None = None

    @property
    def restored(self) -> str:
        """The last subject (``subjectFollowing`` order) this dormancy's wake restored in its
        second pass: ``""`` if none (or the cursor is an older dormancy's)."""
        if self.cursor is None or str(self.cursor.get(GENERATION, "")) != self.generation:
            return ""
        return str(self.cursor.get(RESTORED, ""))

    @property
    def dormant(self) -> bool:
        return self.marker is not None

    @property
    def since(self) -> float:
        """When this dormancy began (epoch seconds; 0 when not dormant)."""
        return float(self.marker[SINCE]) if self.marker is not None else 0.0

    @property
    def generation(self) -> str:
        return str(self.marker.get(GENERATION, "")) if self.marker is not None else ""


def head_of(rows: list[TableEntity]) -> Head:
    """The activity rows among a head query's rows."""
    keys = (STAMP_ROW, CURSOR_ROW, MARKER_ROW)
    found = {row["RowKey"]: row for row in rows if row["RowKey"] in keys}
    stamp_row = found.get(STAMP_ROW)
    stamp = stamp_row.get(STAMP) if stamp_row is not None else None
    return Head(
        int(stamp) if stamp is not None else None,
        stamp_row,
        found.get(MARKER_ROW),
        found.get(CURSOR_ROW),
    )


class ActivityRepository:
    """The stamp, the marker and the follow rows' flags."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._expiries = ExpiriesRepository(storage)

    async def head(self, reader: str) -> Head:
        """Both activity rows: one query."""
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(TIMELINES, reader),
                _HEAD,
                {"pk": reader, "low": STAMP_ROW, "high": MARKER_ROW},
                select=["RowKey", *HEAD_SELECT],
                limit=10,
                continuation=None,
            )
        return head_of(list(page.items))

    async def ever_followed(self, reader: str) -> AsyncIterator[list[str]]:
        """Every subject the reader's ``subjectFollowing`` index names, followed now or not
        (the index never deletes a row: this covers every follow row a sweep could mark)."""
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard(kind="query-1000"):
                page = await query_page(
                    self._storage.reader(SUBJECT_FOLLOWING, reader),
                    LISTING,
                    {"pk": reader, "meta": META},
                    select=["RowKey"],
                    limit=1000,
                    continuation=continuation,
                )
            yield [str(entity["RowKey"]) for entity in page.items]
            continuation = page.continuation
            if continuation is None:
                return

    async def stamp(
        self,
        reader: str,
        stamp: int,
        inactivity: Inactivity,
        *,
        first: bool,
        read: TableEntity | None = None,
    ) -> bool:
        """Record activity in period ``stamp``; the first stamp files the reader's dormancy
        check first (the sweep re-files it from then on). Conditional, so reads that start
        together write once: over ``read`` (the stamp row as a head query returned it,
        ``If-Match``), else the first only if no stamp exists (a later one without ``read``
        is unconditional); False if another write came first.
        Stored as a double (exact to 2**53): a period of seconds makes numbers past Int32."""
        if first:
            await self.file_check(reader, inactivity.due(stamp))
        row = {"PartitionKey": reader, "RowKey": STAMP_ROW, STAMP: float(stamp)}
        if read is None and first:
            return await create_entity(self._storage, TIMELINES, row)
        table = self._storage.table(TIMELINES, reader)
        async with self._storage.guard(kind="write-1"):
            if read is None:
                await table.upsert_entity(row, mode=UpdateMode.MERGE)
                return True
            try:
                await table.update_entity(row, mode=UpdateMode.MERGE, **if_unchanged(read))
            except (ResourceNotFoundError, ResourceModifiedError):
                return False
        return True

    async def stamp_if_old(self, reader: str, head: Head, inactivity: Inactivity) -> None:
        """What a read records: the current period's stamp, if ``head``'s is older."""
        current = inactivity.stamp()
        if head.stamp is None or head.stamp < current:
            first = head.stamp is None
            await self.stamp(reader, current, inactivity, first=first, read=head.stamp_row)

    async def file_check(self, reader: str, at: float) -> None:
        await self._expiries.note(DORMANCY, TIMELINES, reader, STAMP_ROW, at=at)

    async def start_dormancy(self, reader: str, head: Head) -> bool:
        """Write the marker, on the condition that the stamp is unchanged since ``head`` was
        read (one transaction): False if the reader was active meanwhile or a marker exists."""
        marker = {
            "PartitionKey": reader,
            "RowKey": MARKER_ROW,
            GENERATION: uuid.uuid4().hex,
            STATE: DORMANT,
            WAKE_AT: 0.0,
            SINCE: time.time(),
        }
        operations: list[Any] = [("create", marker)]
        if head.stamp_row is not None:
            keys = {"PartitionKey": reader, "RowKey": STAMP_ROW}
            condition = {"mode": UpdateMode.MERGE, **if_unchanged(head.stamp_row)}
            operations.insert(0, ("update", keys, condition))
        try:
            await transact(self._storage, TIMELINES, reader, operations)
        except TableTransactionError as error:
            if failed_index(error, 404, 409, 412) is None:
                raise
            return False
        return True

    async def mark_waking(self, reader: str, marker: TableEntity) -> bool:
        """Move the marker to ``waking`` (unless changed since read): after this no sweep
        that reads it flags anything."""
        keys = {"PartitionKey": reader, "RowKey": MARKER_ROW, STATE: WAKING, WAKE_AT: time.time()}
        async with self._storage.guard(kind="write-1"):
            try:
                await self._storage.table(TIMELINES, reader).update_entity(
                    keys, mode=UpdateMode.MERGE, **if_unchanged(marker)
                )
            except (ResourceNotFoundError, ResourceModifiedError):
                return False
        return True

    async def end_dormancy(self, reader: str, generation: str) -> bool:
        """Delete this dormancy's marker (the wake's last step), judged on a fresh read by
        generation and state only: a read that resent the wake meanwhile rewrote only
        ``wake_at`` (its ETag changed, nothing that matters), so it is read again and the
        delete retried; False if the marker is gone or another dormancy's."""
        for _ in range(_END_TRIES):
            marker = (await self.head(reader)).marker
            if marker is None or str(marker.get(GENERATION, "")) != generation:
                return False
            if marker.get(STATE) != WAKING:
                return False
            if await delete_entity(self._storage, TIMELINES, reader, MARKER_ROW, etag(marker)):
                return True
        raise ResourceModifiedError(f"{reader}'s marker changed {_END_TRIES} times in a row")

    async def note_restored(self, reader: str, generation: str, subject: str) -> None:
        """Record that the wake's second pass restored every subject up to ``subject``:
        dormant pages read those from the partition from now on."""
        row = {"PartitionKey": reader, "RowKey": CURSOR_ROW, GENERATION: generation}
        row[RESTORED] = subject
        await submit_batch(self._storage, TIMELINES, reader, [("upsert", row)])

    async def follow_row(self, subject: str, reader: str) -> TableEntity | None:
        """The reader's follow row of ``subject`` (None: no follow), with its ETag: a sweep
        reads it before it reads the marker, and marks it only if unchanged since."""
        return await get_entity(
            self._storage, SUBJECT_FOLLOWERS, subject, reader, select=["RowKey", FLAG]
        )

    async def flag(
        self,
        subject: str,
        reader: str,
        read: TableEntity,
        generation: str,
        since: float,
        *,
        not_after: float,
    ) -> bool:
        """Mark the follow row as read (``read``, read before the marker was read as this
        dormancy's ``dormant``) inactive for posts made from ``since``, if unchanged since
        read: a wake's unmark always writes, so a mark can land only before it, however
        late it was sent (docs/guarantees.md). Not sent after ``not_after``; False if the
        row changed or went."""
        entity = {"PartitionKey": subject, "RowKey": reader, FLAG: generation, FLAG_FROM: since}
        async with self._storage.guard(kind="write-1", not_after=not_after):
            try:
                await self._storage.table(SUBJECT_FOLLOWERS, subject).update_entity(
                    entity, mode=UpdateMode.MERGE, **if_unchanged(read)
                )
            except (ResourceNotFoundError, ResourceModifiedError):
                return False
        return True

    async def unflag(self, subject: str, reader: str) -> None:
        """Clear the mark, whether set or not: a write every time, so any sweep's mark based
        on an earlier read of the row now fails its condition (no follow: nothing to do)."""
        await self._set_flag(subject, reader, "")

    async def _set_flag(self, subject: str, reader: str, value: str) -> None:
        entity = {"PartitionKey": subject, "RowKey": reader, FLAG: value}
        async with self._storage.guard(kind="write-1"):
            with suppress(ResourceNotFoundError):
                await self._storage.table(SUBJECT_FOLLOWERS, subject).update_entity(
                    entity, mode=UpdateMode.MERGE
                )
