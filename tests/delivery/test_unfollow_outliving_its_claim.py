"""An unfollow whose message waits in a backlog longer than the claim lifetime.

R follows A and holds A's post P. R unfollows (its message U waits in a backlog); A deletes
P (the delete's passes skip R: not following). The sweep removes U's claim after its
lifetime; R follows again; then U runs, claims anew and cannot tell "never made" from "made,
claim swept". Treated as never made, it skipped the reconcile that removes P's copy, and P,
deleted, stayed in R's timeline for good; treated as ambiguous, it reconciles.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import unique
from tests.delivery.helpers import add_follow, add_posts, add_users, run_every_pass, timeline_ids
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import TICKS_PER_SECOND
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.model.keys import now_ticks
from timeline.model.messages import Followed, PostCreated, PostDeleted, Unfollowed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.follows import request_id
from timeline.tables.repositories import Repositories

LIFETIME_S = 3600.0
TIMING = Timing(
    write_deadline_s=1.0,
    sweep_delay_s=1.5,
    arrival_window_s=0.3,
    follow_cooldown_s=0.5,
    claim_lifetime_s=LIFETIME_S,
)


@pytest.mark.parametrize("swept", [False, True], ids=["claim-kept", "claim-swept"])
async def test_a_late_unfollow_removes_a_post_deleted_while_it_waited(
    own: Storage, swept: bool
) -> None:
    repos = Repositories.on(own)
    author, reader = unique("a"), unique("r")
    await add_users(repos, author, reader)
    await add_follow(repos, reader, author)
    [post] = await add_posts(repos, author, 1)
    async with PartitionWriter(own, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(own, writer, timing=TIMING)
        await run_every_pass(worker, PostCreated(author=author, post_id=post.post_id))
        assert post.post_id in await timeline_ids(repos, reader)
        # R unfollows, as the API does; U then waits in a backlog past the claim lifetime
        t_u = now_ticks() - int((LIFETIME_S + 60) * TICKS_PER_SECOND)
        late_unfollow = Unfollowed(follower=reader, subject=author, requested=t_u)
        assert await repos.follows.remove(reader, author, request=request_id(reader, t_u))
        await repos.follows.sync_index(reader, author)
        assert await repos.posts.delete(author, post.post_id)
        await run_every_pass(worker, PostDeleted(author=author, post_id=post.post_id))
        if swept:
            await Sweeper(own, claim_lifetime_s=LIFETIME_S).sweep(
                now=time.time() + LIFETIME_S + GRACE_S + 120
            )
        await asyncio.sleep(TIMING.cooldown_s)  # the re-follow is not a toggle
        t_f = now_ticks()
        assert await repos.follows.add(
            reader, author, datetime.now(UTC), request=request_id(reader, t_f)
        )
        await repos.follows.sync_index(reader, author)
        await run_every_pass(worker, Followed(follower=reader, subject=author, requested=t_f))
        await run_every_pass(worker, late_unfollow)
    assert post.post_id not in await timeline_ids(repos, reader)
