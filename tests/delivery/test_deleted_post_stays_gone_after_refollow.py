"""A deleted post must not stay for good in a re-follower's timeline.

Each sweep defers to the other: the delete's sweep skips R because R does not follow A at
that moment ("the unfollow's passes remove it"), and the unfollow's sweep skips its purge
because R follows A again by then ("every copy has its reason back"). A copy of a *deleted*
post never gets its reason back.

Interleaving (timing: D = 1 s, S = 2.5 s; every step is what the API / worker code does):
  1. R follows A; A's post P exists. A delivery of P reads P and R, buffers R's copy, and its
     worker dies before the re-check (SIGKILL; or SIGTERM drain: tasks are cancelled, then
     writer.close() flushes their buffered writes).
  2. A deletes P: the delete's first pass runs (R's copy is not there yet).
  3. R unfollows A: the unfollow's first pass purges (R's copy is not there yet).
  4. The dead delivery's copy lands (inside D of its read).
  5. S after (2): the delete's sweep reads A's followers: R is not one -> R skipped.
  6. R follows A again (backfill: P is gone, so it is not read and not re-checked).
  7. S after (3): the unfollow's sweep: R follows A -> DONE without a purge.
  Queues empty; R's timeline holds P, which does not exist.
"""

from __future__ import annotations

import asyncio
import contextlib

from tests.conftest import eventually
from tests.delivery.helpers import add_follow, author_and_reader, remove_follow, timeline_ids
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue, Done
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.model.messages import Followed, PostCreated, PostDeleted, Unfollowed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories

TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=2.5)


async def test_deleted_post_survives_unfollow_refollow(
    storage: Storage, repos: Repositories
) -> None:
    author, reader, [post] = await author_and_reader(repos)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        worker = FanoutProcessor.on(storage, prompt, timing=TIMING)
        # 1. the delivery buffers R's copy, then its worker dies before the re-check
        dying = asyncio.create_task(
            FanoutProcessor.on(storage, held, timing=TIMING).handle(
                PostCreated(author=author, post_id=post.post_id)
            )
        )

        async def buffered() -> bool:
            return held.buffered >= 2

        await eventually(buffered, timeout_s=5, what="the delivery's copies buffered")
        dying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await dying
        # 2. delete: the API deletes the source row, the worker's first pass
        await repos.posts.delete(author, post.post_id)
        delete_first = await worker.handle(PostDeleted(author=author, post_id=post.post_id))
        assert isinstance(delete_first, Continue)
        # 3. unfollow 0.5 s later (the gap is the schedule under test, not a wait for sync):
        # the API removes the follow, the worker's first pass
        await asyncio.sleep(0.5)
        await remove_follow(repos, reader, author)
        unfollow_first = await worker.handle(Unfollowed(follower=reader, subject=author))
        assert isinstance(unfollow_first, Continue)
        # 4. the dead delivery's write lands (well inside D = 1 s of its read)
        await held.flush()
        assert post.post_id in await timeline_ids(repos, reader)
        # 5. S after the delete's first pass: its sweep
        await asyncio.sleep(TIMING.sweep_delay_s - 0.5 + 0.05)
        assert isinstance(await worker.handle(delete_first.message), Done)
        # 6. R follows A again; its backfill
        await add_follow(repos, reader, author)
        assert isinstance(  # within the cool-down of an unfollow: damped, one more pass
            await worker.handle(Followed(follower=reader, subject=author)),
            Done | Continue,
        )
        # 7. S after the unfollow's first pass (its 0.5 s lag behind the delete's): its sweep
        await asyncio.sleep(0.5)
        assert isinstance(await worker.handle(unfollow_first.message), Done)
    timeline = await timeline_ids(repos, reader)
    print(
        f"\nP exists: {await repos.posts.get(author, post.post_id) is not None}; "
        f"R follows A: {await repos.follows.is_following(reader, author)}; "
        f"R's timeline: {timeline}; P = {post.post_id}"
    )
    assert post.post_id not in timeline, "ghost: a deleted post in a timeline, for good"
