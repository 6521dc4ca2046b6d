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
read (``ge``, not ``gt``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from azure.data.tables import TableEntity

from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page

OVERLAP_S = 5.0
"""How far below the newest ``Timestamp`` read the next read starts (clock and commit skew)."""
ROWS_PER_REQUEST = 1000
_LANDED = "PartitionKey eq @pk and Timestamp ge @since"


def landed_at(entity: TableEntity) -> datetime:
    """When the row was last written (selected with every read here, so never missing)."""
    stamp = entity.metadata["timestamp"]
    assert stamp is not None
    return stamp


class Landed:
    """The rows of one partition written since ``since``, each returned once per write."""

    def __init__(self, table: str, partition: str, since: datetime, select: list[str]) -> None:
        self.table = table
        self.partition = partition
        self.since = since
        self._select = [*select, "Timestamp"]
        self._read: dict[str, datetime] = {}
        """The row keys read at or after ``since``, with the ``Timestamp`` each was read at."""

    async def new_rows(self, storage: Storage) -> list[TableEntity]:
        """The rows written since the cursor and not read before: one request when nothing
        landed; more only while pages come back full of rows."""
        rows: list[TableEntity] = []
        continuation: dict[str, str] | None = None
        while True:
            async with storage.guard():
                page = await query_page(
                    storage.reader(self.table, self.partition),
                    _LANDED,
                    self._parameters(),
                    select=self._select,
                    limit=ROWS_PER_REQUEST,
                    continuation=continuation,
                )
            rows += page.items
            continuation = page.continuation
            if not page.items or continuation is None:
                break
        fresh = [row for row in rows if self._read.get(row["RowKey"]) != landed_at(row)]
        self._advance(rows)
        return fresh

    def _parameters(self) -> dict[str, Any]:
        return {"pk": self.partition, "since": self.since}

    def _advance(self, rows: list[TableEntity]) -> None:
        """Move ``since`` to ``OVERLAP_S`` below the newest stamp read; remember what was
        read from there on (older rows are never returned again)."""
        for row in rows:
            self._read[row["RowKey"]] = landed_at(row)
        if rows:
            newest = max(landed_at(row) for row in rows)
            self.since = max(self.since, newest - timedelta(seconds=OVERLAP_S))
        self._read = {key: stamp for key, stamp in self._read.items() if stamp >= self.since}
