"""The inactive phase's wait for a wake's end, on Azurite."""

from __future__ import annotations

import asyncio
import time
import uuid

from azure.data.tables import UpdateMode

from loadtest.bench.inactive import _woken
from tests.conftest import unique
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.activity import GENERATION, MARKER_ROW, ActivityRepository, Head


class CountedHeads(ActivityRepository):
    """Sets ``seen_twice`` once two head reads have shown the generation ``first``."""

    def __init__(self, storage: Storage, first: str) -> None:
        super().__init__(storage)
        self._first, self._seen = first, 0
        self.seen_twice = asyncio.Event()

    async def head(self, reader: str) -> Head:
        head = await super().head(reader)
        self._seen += head.generation == self._first
        if self._seen >= 2:
            self.seen_twice.set()
        return head


async def test_the_wait_ends_on_a_new_dormancy_not_before(storage: Storage) -> None:
    """The quick run's wake outlasts its period: a reader who stops reading goes dormant
    again within a sweep of the wake's end, often between two of the wait's polls. The wait
    goes on while the first dormancy's marker stands, and ends on a marker of another
    generation (it waited for no marker, forever)."""
    reader = unique("back")
    assert await ActivityRepository(storage).start_dormancy(reader, Head())
    first = (await ActivityRepository(storage).head(reader)).generation
    repo = CountedHeads(storage, first)
    waiting = asyncio.create_task(_woken(repo, reader, first, time.monotonic()))
    seen = asyncio.create_task(repo.seen_twice.wait())
    await asyncio.wait({waiting, seen}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert not waiting.done(), "the wait ended while the first dormancy's marker stood"
    assert seen.done()
    # the next dormancy's marker, in one write: no poll can see the reader without one
    await storage.table(TIMELINES, reader).update_entity(
        {"PartitionKey": reader, "RowKey": MARKER_ROW, GENERATION: uuid.uuid4().hex},
        mode=UpdateMode.MERGE,
    )
    assert await asyncio.wait_for(waiting, 30) < 30
