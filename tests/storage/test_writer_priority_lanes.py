"""The writer's lanes: a fresh post's copy must not wait for background rows to be sent.

docs/overload.md: "HIGH work is admitted against the HIGH backlog only, so a post's reads are
not held back by 100,000 buffered backfill rows". Its writes are: every row, HIGH or LOW,
takes a place of one shared ``max_buffered`` semaphore, so once background rows fill it a
HIGH upsert waits until enough LOW rows have been sent."""

from __future__ import annotations

import asyncio

from tests.conftest import eventually, unique
from timeline.delivery.batching.tracker import Tracker
from timeline.delivery.batching.write_buffer import BACKGROUND_SHARE
from timeline.delivery.batching.writer import PartitionWriter
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.priority import Priority, running_as
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES

BUFFERED = 200
LOW_SHARE = int(BUFFERED * BACKGROUND_SHARE)


async def test_a_high_row_is_buffered_while_background_rows_fill_the_buffer(
    storage: Storage,
) -> None:
    deadline = asyncio.get_running_loop().time() + 3600
    properties = {"author": "a", "text": "t"}
    async with PartitionWriter(storage, TIMELINES, linger_s=3600, max_buffered=BUFFERED) as writer:
        background, partitions = Tracker(), [unique("low") for _ in range(4)]

        async def backfill_row(index: int) -> None:
            row = new_post_id(now_ticks() + index)
            await writer.upsert(partitions[index % 4], row, properties, background,
                                deadline=deadline)  # fmt: skip

        with running_as(Priority.LOW):  # backfills try to fill the whole buffer
            rows = [asyncio.create_task(backfill_row(index)) for index in range(BUFFERED)]

            async def share_full() -> bool:
                return writer.buffered >= LOW_SHARE

            await eventually(share_full, timeout_s=10, what="the backfills to fill their share")
        assert 0 < writer.buffered < BUFFERED  # background rows fill only their share
        fresh = Tracker()
        with running_as(Priority.HIGH):  # a fresh post's copy
            copy = writer.upsert(unique("high"), new_post_id(now_ticks()), properties, fresh,
                                 deadline=deadline)  # fmt: skip
            done, _ = await asyncio.wait({asyncio.ensure_future(copy)}, timeout=2)
        assert done, "the HIGH copy waits for buffer space held by background rows"
        await writer.flush()
        await asyncio.gather(*rows)
