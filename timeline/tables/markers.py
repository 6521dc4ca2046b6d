"""Read markers: where a reader stopped in its home timeline, one row per reader.

The row is ``!r`` in the reader's own ``timelines`` partition, among the head rows (activity
``!a``/``!c``/``!d``, merge rows ``!m-…``, the merge count ``!n``): it moves with the
partition on a rebalance (which copies every row), the cap's trim and every post listing
start at ``FIRST_POST_KEY`` so they neither count nor drop it, and the home read's head query
skips it like any head row. Not ``!m``: that would sit inside the merge rows' prefix range.

``position`` is the row key of the newest entry the reader has seen (what a page's signed
``newest`` wraps); ``version`` counts the writes, 1 after the first, stored as a double
(exact to 2**53, what a JavaScript client holds; an Int64 would read back as a typed
property). Every write is conditional: the first is insert-if-absent, later ones
``If-Match`` the ETag as read, so of two devices writing from the same version exactly one
wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.rows import create_entity, etag, get_entity, if_unchanged_etag

MARKER_ROW = "!r"
POSITION, VERSION = "position", "version"


@dataclass(frozen=True, slots=True)
class StoredMarker:
    """The marker row as read: the position's row key, its version and the row's ETag."""

    position: str
    version: int
    etag: str


class MarkersRepository:
    """The ``!r`` row of each reader's ``timelines`` partition."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def get(self, reader: str) -> StoredMarker | None:
        """The reader's marker (None: never written): one point read."""
        entity = await get_entity(
            self._storage, TIMELINES, reader, MARKER_ROW, select=[POSITION, VERSION]
        )
        if entity is None:
            return None
        return StoredMarker(str(entity[POSITION]), int(entity[VERSION]), etag(entity))

    async def create(self, reader: str, position: str) -> bool:
        """The first marker, version 1, only if none exists; False if one does."""
        row = {"PartitionKey": reader, "RowKey": MARKER_ROW, POSITION: position, VERSION: 1.0}
        return await create_entity(self._storage, TIMELINES, row)

    async def replace(self, reader: str, position: str, read: StoredMarker) -> bool:
        """Move the marker on from ``read`` (version + 1) if the row is unchanged since it
        was read; False if another write came first (or the row went)."""
        row = {
            "PartitionKey": reader,
            "RowKey": MARKER_ROW,
            POSITION: position,
            VERSION: float(read.version + 1),
        }
        async with self._storage.guard(kind="write-1"):
            try:
                await calls.update_entity(
                    self._storage.table(TIMELINES, reader),
                    row,
                    UpdateMode.REPLACE,
                    **if_unchanged_etag(read.etag),
                )
            except (ResourceNotFoundError, ResourceModifiedError):
                return False
        return True
