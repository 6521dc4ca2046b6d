"""Inactive readers across an upgrade and across dormancies: marks from before
``inactive_from`` lose nothing, and a mark of an ended dormancy cannot land on the next one.
Real Azurite; requests held on the HTTP session as in ``test_inactive_reader_late_marks``."""

from __future__ import annotations

import asyncio

from azure.data.tables import UpdateMode

from tests.delivery.helpers import add_posts, run_every_pass
from tests.delivery.test_inactive_reader_late_marks import wired
from tests.delivery.test_inactive_reader_races import (
    INACTIVITY,
    LATER,
    Wire,
    follow_row_write,
    world,
)
from timeline.config import Settings
from timeline.delivery.dormancy import Dormancy
from timeline.model.messages import PostCreated
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS, TIMELINES
from timeline.storage.writer import PartitionWriter
from timeline.tables.follows import INACTIVE, INACTIVE_FROM
from timeline.tables.rows import get_entity


async def test_a_mark_from_before_the_upgrade_does_not_lose_an_older_post(
    storage: Storage,
) -> None:
    """Rolling upgrade: a follow row marked by a worker from before ``inactive_from`` (only
    ``inactive`` set) skips nothing, since the new wake copies only posts made from the
    marker's ``since``: a post made before the dormancy whose fan-out comes late still
    reaches the reader."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        author = w.authors[0]
        (early,) = await add_posts(w.repos, author, 1)  # made now, its message still queued
        await w.pages()  # stamped
        assert await Dormancy(storage, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
        assert await w.flagged() == [author]
        row = await get_entity(storage, SUBJECT_FOLLOWERS, author, w.reader)
        assert row is not None
        legacy = {key: value for key, value in row.items() if key != INACTIVE_FROM}
        assert legacy[INACTIVE]
        table = storage.table(SUBJECT_FOLLOWERS, author)
        await table.upsert_entity(legacy, mode=UpdateMode.REPLACE)  # as the old sweep left it

        await run_every_pass(w.processor, PostCreated(author=author, post_id=early.post_id))
        await w.pages()  # the reader is back: wake queued
        await run_every_pass(w.processor, await w.wake_message())
        assert await w.marker_state() is None
        assert early.post_id in await w.partition(), "a post from before the dormancy is lost"


async def test_a_held_mark_of_an_ended_dormancy_cannot_land_on_the_next_dormancy(
    settings: Settings, storage: Storage
) -> None:
    """Claim 1 against a second dormancy: a mark of the first dormancy, held on the wire past
    its whole wake and past the next dormancy's own marks, is released. Had it landed it
    would bound the row's skips by the first ``since`` while the second wake copies from the
    second ``since``: a post made between the two, fanned out late, would be lost. It fails
    its condition (the row was rewritten twice since it was read), and the post arrives."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        w = await world(storage, writer, authors=1)
        author = w.authors[0]
        await w.pages()  # stamped
        wire = Wire()
        wire.arm(follow_row_write)
        async with wired(settings, wire) as slow:
            sweep = asyncio.create_task(
                Dormancy(slow, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
            )
            await asyncio.wait_for(wire.held.wait(), 20)  # the first dormancy's mark, held
            first = (await w.repos.activity.head(w.reader)).since
            await w.pages()  # the reader is back: wake queued, marker "waking"
            await run_every_pass(w.processor, await w.wake_message())
            assert await w.marker_state() is None
            (between,) = await add_posts(w.repos, author, 1)  # its message still queued
            assert await Dormancy(storage, INACTIVITY, flag_window_s=60).check(w.reader, LATER)
            second = (await w.repos.activity.head(w.reader)).since
            assert first < between.created_at.timestamp() < second
            assert await w.flagged() == [author]
            wire.gate.set()
            assert not await asyncio.wait_for(sweep, 20), "the held mark did not fail"
        row = await get_entity(storage, SUBJECT_FOLLOWERS, author, w.reader)
        assert row is not None
        assert row[INACTIVE_FROM] == second
        await run_every_pass(w.processor, PostCreated(author=author, post_id=between.post_id))
        await w.pages()
        await run_every_pass(w.processor, await w.wake_message())
        assert between.post_id in await w.partition()
