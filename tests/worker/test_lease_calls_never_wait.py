"""A message's lease is renewed whatever waits in the worker's limiter: queue calls do not
take its places, so a renewal waits neither behind user-facing calls (which may hold every
place) nor for the request rate behind a background backlog. Waiting, a renewal would let
the lease run out while its work runs: the message is leased a second time (its work done
twice) and triaged as a crash suspect (both found by a review of a version that limited
queue calls)."""

from __future__ import annotations

import asyncio

from fanout_worker.isolation import triage
from fanout_worker.lease import Lease
from tests.conftest import provisioned, storage_on, unique
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Followed, PostCreated, decode
from timeline.model.priority import Priority, running_as
from timeline.storage.flow.limiter import AdaptiveLimiter, LimiterSettings
from timeline.storage.queue import FanoutQueue
from timeline.tools.azurite import Azurite

VISIBILITY_S = 2
RATE = 10.0


async def test_a_lease_is_kept_while_user_facing_calls_queue_in_the_limiter(
    private_azurite: Azurite,
) -> None:
    limiter = AdaptiveLimiter(LimiterSettings(initial=2, minimum=2, maximum=2))
    async with storage_on([private_azurite], limiter=limiter) as worker_storage:
        await provisioned(worker_storage)
        await worker_storage.refresh_placement()
        queue = FanoutQueue(worker_storage)
        await queue.send(PostCreated(author=unique("a"), post_id=new_post_id(now_ticks())))
        lane = queue.lane(Priority.HIGH)
        [leased] = await lane.receive(1, VISIBILITY_S)

        async def user_facing_call() -> None:  # a post's page read or write: 0.25 s each
            with running_as(Priority.HIGH):
                async with limiter.slot("write-100"):
                    await asyncio.sleep(0.25)

        # 40 user-facing calls at a limit of 2: five seconds of work queued in the limiter
        load = [asyncio.create_task(user_facing_call()) for _ in range(40)]
        try:
            async with Lease(lane, leased, VISIBILITY_S) as lease:
                await asyncio.sleep(VISIBILITY_S + 1.0)  # the message's work runs on
                async with storage_on([private_azurite]) as other:  # another worker
                    stolen = await FanoutQueue(other).lane(Priority.HIGH).receive(1, 30)
                noticed = lease.lost  # has the first worker even seen it go?
        finally:
            await asyncio.gather(*load)
    if stolen:  # leased a second time while the first lease's work runs on
        [again] = stolen
        suspect = triage(decode(again.content), again.dequeue_count or 1, 3)
        raise AssertionError(
            "the lease ran out while its renewal waited in the limiter (its holder noticed:"
            f" {noticed}); leased again with dequeue count {again.dequeue_count}, triaged as"
            f" a crash suspect at level {suspect.level}"
        )


async def test_a_renewal_does_not_wait_behind_a_background_backlog_for_the_rate(
    private_azurite: Azurite,
) -> None:
    limiter = AdaptiveLimiter(LimiterSettings(initial=64, maximum=64, requests_per_s=RATE))
    async with storage_on([private_azurite]) as setup:
        await provisioned(setup)
        queue = FanoutQueue(setup)
        await queue.send(Followed(follower=unique("f"), subject=unique("s")))
        [leased] = await queue.lane(Priority.LOW).receive(1, VISIBILITY_S)
    async with storage_on([private_azurite], limiter=limiter) as worker_storage:
        lane = FanoutQueue(worker_storage).lane(Priority.LOW)

        async def background_call() -> None:  # a backfill's read: quick, once let out
            with running_as(Priority.LOW):
                async with limiter.slot("query"):
                    await asyncio.sleep(0)

        # 60 background calls at 10 a second: six seconds of them waiting for the rate
        backlog = [asyncio.create_task(background_call()) for _ in range(60)]
        await asyncio.sleep(0)
        try:
            async with Lease(lane, leased, VISIBILITY_S) as lease:
                await asyncio.sleep(VISIBILITY_S + 1.0)  # the backfill's work runs on
                async with storage_on([private_azurite]) as other:  # another worker
                    stolen = await FanoutQueue(other).lane(Priority.LOW).receive(1, 30)
                noticed = lease.lost
        finally:
            for call in backlog:
                call.cancel()
            await asyncio.gather(*backlog, return_exceptions=True)
    assert stolen == [], (
        "the lease ran out while its renewal waited for the rate behind background calls"
        f" (its holder noticed: {noticed}; leased again, dequeue count"
        f" {stolen[0].dequeue_count if stolen else 0})"
    )
