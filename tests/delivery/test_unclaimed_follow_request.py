"""A follow/unfollow request whose own message finished WITHOUT claiming it.

The worker claims a request only when it finds the request's effect missing. If the effect is
already there because of ANOTHER request (a client retry, a second tab), the message is done
with no claim, and the stalled request's write can still land at any later time.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from tests.conftest import unique
from tests.delivery.helpers import add_posts, add_users, timeline_ids
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue, Done
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.errors import StorageUnavailableError
from timeline.model.entities import Post
from timeline.model.keys import now_ticks
from timeline.model.messages import Followed, Unfollowed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.follows import request_id
from timeline.tables.repositories import Repositories

TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=2.5, arrival_window_s=0.5)


async def _state(repos: Repositories, reader: str, author: str, posts: list[Post]) -> str:
    return (
        f"follows={await repos.follows.is_following(reader, author)} "
        f"timeline={sorted(await timeline_ids(repos, reader))} "
        f"live={sorted(p.post_id for p in posts)}"
    )


async def test_stalled_follow_lands_after_its_message_finished(
    storage: Storage, repos: Repositories
) -> None:
    author, reader = unique("author"), unique("reader")
    await add_users(repos, author, reader)
    posts = await add_posts(repos, author, 2)
    follows = repos.follows
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer, timing=TIMING)
        # A: PUT follow sends Followed(tA), then stalls before follows.add
        a = Followed(follower=reader, subject=author, requested=now_ticks())
        # B: the client's retry (or a second tab): is_following False -> send, add, sync
        tb = now_ticks()
        assert await follows.add(reader, author, datetime.now(UTC), request=request_id(reader, tb))
        await follows.sync_index(reader, author)
        b = Followed(follower=reader, subject=author, requested=tb)
        # the worker: both follow messages find R following -> backfill, Done, nothing claimed
        assert isinstance(await worker.handle(a), Done)
        assert isinstance(await worker.handle(b), Done)
        # C: R unfollows; both passes run
        tc = now_ticks()
        assert await follows.remove(reader, author, request=request_id(reader, tc))
        await follows.sync_index(reader, author)
        first = await worker.handle(Unfollowed(follower=reader, subject=author, requested=tc))
        assert isinstance(first, Continue)
        await asyncio.sleep(TIMING.sweep_delay_s)
        assert isinstance(await worker.handle(first.message), Done)
        # A's stalled write lands, long after the arrival window; every message is done
        await asyncio.sleep(1.0)  # the lateness is the behaviour under test, not a wait for sync
        try:
            landed = await follows.add(
                reader, author, datetime.now(UTC), request=request_id(reader, a.requested)
            )
        except StorageUnavailableError:  # claimed: the API answers 503, nothing changes
            landed = False
        await follows.sync_index(reader, author)
    state = await _state(repos, reader, author, posts)
    print(f"\nlate add of A landed={landed}; {state}")
    assert not landed, "a follow landed after its message was done: never backfilled"


async def test_stalled_unfollow_lands_after_both_passes(
    storage: Storage, repos: Repositories
) -> None:
    author, reader = unique("author"), unique("reader")
    await add_users(repos, author, reader)
    follows = repos.follows
    await follows.add(reader, author, datetime.now(UTC))
    await follows.sync_index(reader, author)
    posts = await add_posts(repos, author, 2)
    await repos.timelines.put_many(reader, posts)  # delivered while following
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer, timing=TIMING)
        # U1: DELETE following sends Unfollowed(t1), then stalls before follows.remove
        u1 = Unfollowed(follower=reader, subject=author, requested=now_ticks())
        # U2: the client's retry lands
        t2 = now_ticks()
        assert await follows.remove(reader, author, request=request_id(reader, t2))
        await follows.sync_index(reader, author)
        u2 = Unfollowed(follower=reader, subject=author, requested=t2)
        # the worker: both first passes find R not following -> purge, Continue (no claim)
        p1, p2 = await worker.handle(u1), await worker.handle(u2)
        assert isinstance(p1, Continue)
        assert isinstance(p2, Continue)
        # R follows again (F), backfilled
        tf = now_ticks()
        assert await follows.add(reader, author, datetime.now(UTC), request=request_id(reader, tf))
        await follows.sync_index(reader, author)
        assert isinstance(  # within the cool-down of an unfollow: damped, one more pass
            await worker.handle(Followed(follower=reader, subject=author, requested=tf)),
            Done | Continue,
        )
        # both sweeps: R follows -> reconcile, Done
        await asyncio.sleep(TIMING.sweep_delay_s)
        assert isinstance(await worker.handle(p1.message), Done)
        assert isinstance(await worker.handle(p2.message), Done)
        # U1's stalled remove lands; no message is left to purge
        try:
            landed = await follows.remove(reader, author, request=request_id(reader, u1.requested))
        except StorageUnavailableError:
            landed = False
        await follows.sync_index(reader, author)
    state = await _state(repos, reader, author, posts)
    print(f"\nlate remove of U1 landed={landed}; {state}")
    assert not landed, "an unfollow landed after both its passes: copies stay for good"
