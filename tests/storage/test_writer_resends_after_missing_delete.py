"""A copy justified by a read at r lands before r + D + T (docs/guarantees.md), even when
``submit_batch``'s "drop the missing delete and resend" loop makes one writer attempt take
k+1 round trips; otherwise a delete's second pass (S > D + T) could run before the copy lands.

Timing here: D = 1 s, T = 1 s, S = 2.5 s (> D + T, as config enforces); each EGT round trip
takes 0.5 s (< T); R's partition holds 6 deletes of already-missing rows (e.g. rows that an
earlier pass already removed: every confirm pass re-deletes rows that are gone) plus the
delivery's upsert. The delivering worker dies after buffering (before its re-check), as in
``_crash_after_write`` in tests/delivery/test_late_copies_are_swept.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from yarl import URL

from tests.conftest import eventually
from tests.delivery.helpers import author_and_reader, timeline_ids
from tests.faults import Delay, table_of
from timeline.config import Settings
from timeline.delivery.batching.tracker import Tracker
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.model.messages import PostCreated, PostDeleted
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories

TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=2.5)
RTT_S = 0.5


def _transaction(method: str, url: URL) -> bool:
    return method == "POST" and table_of(url.path) == "$batch"


async def test_upsert_lands_after_the_sweep(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader, [post] = await author_and_reader(repos)
    slow_egts = Delay(RTT_S, _transaction)  # a slow (throttled, far) round trip, < T
    options = StorageOptions(timeout_s=1.0, trace_configs=(slow_egts.config(),))
    async with (
        Storage(settings.connection_string(), options) as slow,
        PartitionWriter(slow, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        gone = Tracker()
        for i in range(6):  # deletes of rows that are already gone, waiting in R's partition
            await held.delete(reader, post_row_key(new_post_id(now_ticks() - 10**9 - i)), gone)
        started = time.monotonic()
        delivering = FanoutProcessor.on(slow, held, timing=TIMING)
        task = asyncio.create_task(
            delivering.handle(PostCreated(author=author, post_id=post.post_id))
        )

        async def buffered() -> bool:
            return held.buffered >= 8

        await eventually(buffered, timeout_s=5, what="delivery buffered")
        task.cancel()  # the delivering worker dies before its re-check
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sent = held.requests
        flushing = asyncio.create_task(held.flush())  # sent well before the 1 s deadline

        async def on_its_way() -> bool:
            return held.requests > sent

        await eventually(on_its_way, timeout_s=5, what="the held delivery to be sent")

        deleting = FanoutProcessor.on(storage, prompt, timing=TIMING)
        first = await deleting.handle(PostDeleted(author=author, post_id=post.post_id))
        assert isinstance(first, Continue)
        first_done = time.monotonic()
        await asyncio.sleep(first.delay_s)  # the queue makes it visible S later
        assert await deleting.handle(first.message) is not None  # the sweep, DONE
        sweep_done = time.monotonic()
        await flushing
        landed = slow_egts.sent[-1]
    print(
        f"\nfirst pass done at +{first_done - started:.2f}s, sweep done at "
        f"+{sweep_done - started:.2f}s, delivery upsert committed at +{landed - started:.2f}s "
        f"(deadline D={TIMING.write_deadline_s}s, T=1s, D+T=2s); EGT calls: {len(slow_egts.sent)}"
    )
    print("post source row:", await repos.posts.get(author, post.post_id))
    print("reader timeline:", await timeline_ids(repos, reader), " deleted post:", post.post_id)
    assert await timeline_ids(repos, reader) == [], "a deleted post stays in a timeline for good"
