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


async def test_a_new_dormancy_after_the_wake_ends_the_wait(storage: Storage) -> None:
    """The quick run's wake outlasts its period: a reader who stops reading goes dormant
    again within a sweep of the wake's end, often between two of the wait's polls. The wait
    ends on a marker of another generation, not only on no marker (it waited forever)."""
    repo = ActivityRepository(storage)
    reader = unique("back")
    assert await repo.start_dormancy(reader, Head())
    first = (await repo.head(reader)).generation
    waiting = asyncio.create_task(_woken(repo, reader, first, time.monotonic()))
    # the next dormancy's marker, in one write: no poll can see the reader without one
    await storage.table(TIMELINES, reader).update_entity(
        {"PartitionKey": reader, "RowKey": MARKER_ROW, GENERATION: uuid.uuid4().hex},
        mode=UpdateMode.MERGE,
    )
    assert (await repo.head(reader)).dormant
    assert await asyncio.wait_for(waiting, 30) < 30
