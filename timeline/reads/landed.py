"""What landed in one partition since a moment: a cursor on the rows' server-set
``Timestamp`` (the time of each row's last write), read with ``Timestamp ge @since``.

Azure Storage has no change feed for tables; ``Timestamp`` is the closest thing. It is set by
the storage server when a write is applied, so it orders *when rows landed*, which row keys
(the time a post was *made*) do not. The filter is not indexed: the server scans the
partition, but the answer is one request, and only what landed comes back.

A cursor stays ``OVERLAP_S`` below the newest ``Timestamp`` it has read, because a write
stamped before that one may become visible after it (a transaction's stamp is taken before it
commits; a partition served by a new server may stamp from a clock a little behind). So each
read re-reads the rows of the last few seconds, and drops those already read: a row is new
when its (row key, ``Timestamp``) pair was not read before, so a row written again (a
redelivered copy, a trace rewritten) is new again, and two rows with the same stamp are both
read (``ge``, not ``gt``). The cursor also follows the server's clock (its ``Date`` less the
overlap), so an idle read after a burst stops re-reading it, and never stays below more than
``OVERLAP_ROWS`` rows read, so an idle read is one request whatever landed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from azure.data.tables import TableEntity

from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page

OVERLAP_S = 5.0
"""How far below the newest ``Timestamp`` read the next read starts (clock and commit skew)."""
ROWS_PER_REQUEST = 1000
OVERLAP_ROWS = 900
"""The most already-read rows the overlap re-reads: a burst never makes an idle poll cost
more than one request (after one, the overlap is the span of the newest 900 rows)."""
MAX_PAGES = 50
"""Pages one read follows at most (a page may come back empty with a token); past that the
cursor stays and the next poll reads on."""
_LANDED = "PartitionKey eq @pk and Timestamp ge @since"


def landed_at(entity: TableEntity) -> datetime:
    """When the row was last written (selected with every read here, so never missing)."""
    stamp = entity.metadata["timestamp"]
    assert stamp is not None
    return stamp


@dataclass
class Reading:
    """One read of a source, not yet committed: its rows, and what the server said."""

    rows: list[TableEntity] = field(default_factory=list)
    fresh: list[TableEntity] = field(default_factory=list)
    served: datetime | None = None
    """The server's ``Date`` of the last response (seconds, rounded down)."""
    complete: bool = True


class Landed:
    """The rows of one partition written since ``since``, each returned once per write."""

    def __init__(self, table: str, partition: str, since: datetime, select: list[str]) -> None:
        self.table = table
        self.partition = partition
        self.since = since
        self._select = [*select, "Timestamp"]
        self._read: dict[str, datetime] = {}
        """The row keys read at or after ``since``, with the ``Timestamp`` each was read at."""

    async def new_rows(self, storage: Storage) -> Reading:
        """The rows written since the cursor and not read before: one request when nothing
        landed; more only while the server hands a continuation. Changes nothing: the cursor
        moves only with ``commit`` (a poll commits once all its reads succeeded)."""
        reading = Reading()
        continuation: dict[str, str] | None = None

        def served(headers: Mapping[str, str]) -> None:
            date = headers.get("Date")
            reading.served = parsedate_to_datetime(date) if date else None

        for _ in range(MAX_PAGES):
            async with storage.guard():
                page = await query_page(
                    storage.reader(self.table, self.partition),
                    _LANDED,
                    self._parameters(),
                    select=self._select,
                    limit=ROWS_PER_REQUEST,
                    continuation=continuation,
                    on_headers=served,
                )
            reading.rows += page.items
            continuation = page.continuation
            if continuation is None:
                break
        reading.complete = continuation is None
        reading.fresh = [
            row for row in reading.rows if self._read.get(row["RowKey"]) != landed_at(row)
        ]
        return reading

    def commit(self, reading: Reading) -> None:
        """Count ``reading`` as read: its rows are not returned again, and the cursor moves."""
        for row in reading.rows:
            self._read[row["RowKey"]] = landed_at(row)
        if reading.complete:
            self.since = _floor(reading, self.since)
        self._read = {key: stamp for key, stamp in self._read.items() if stamp >= self.since}

    def _parameters(self) -> dict[str, Any]:
        return {"pk": self.partition, "since": self.since}


def _floor(reading: Reading, since: datetime) -> datetime:
    """Where the next read may start: ``OVERLAP_S`` below the newest stamp read and below
    the server's clock (so an idle poll stops re-reading a burst), and above all but the
    newest ``OVERLAP_ROWS`` rows read (so the re-read fits in one page)."""
    overlap = timedelta(seconds=OVERLAP_S)
    stamps = sorted((landed_at(row) for row in reading.rows), reverse=True)
    floors = [since, *(stamp - overlap for stamp in stamps[:1])]
    if reading.served is not None:
        floors.append(reading.served - overlap - timedelta(seconds=1))
    if len(stamps) > OVERLAP_ROWS:
        floors.append(stamps[OVERLAP_ROWS] + timedelta(microseconds=1))
    return max(floors)
