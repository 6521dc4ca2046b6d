"""An API write stalled past its arrival window is refused, not sent.

The worker gives a request up once the arrival window has passed (it claims the follow
request or voids the post id), and the claim or void row ends after the claim lifetime. A
write stalled longer than that (a paused process, an untimed wait) would land once the row
is swept: a follow whose message is done (never backfilled), a post no follower receives.
The API checks the window just before its transaction, so every write lands within the
window plus one storage call, long before the row that guards it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

from api.middleware import status_for
from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import unique
from tests.delivery.helpers import (
    add_follow,
    add_posts,
    add_users,
    run_every_pass,
    timeline_ids,
    unlimited_service,
)
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.errors import ArrivalWindowPassedError
from timeline.model.entities import Post
from timeline.model.keys import arrival_deadline, new_post_id, now_ticks, post_id_ticks
from timeline.model.messages import FanoutMessage, Followed, PostCreated
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.follows import request_id
from timeline.tables.repositories import Repositories

LIFETIME_S = 3600.0
WINDOW_S = 0.3
TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=1.5, arrival_window_s=WINDOW_S)


async def _give_up_and_sweep(storage: Storage, message: FanoutMessage) -> None:
    """What happens while the API stalls: the window passes, the worker gives the request up
    (claim or void row), and the sweep, a lifetime later, removes that row."""
    await asyncio.sleep(WINDOW_S)  # the window passing is the condition under test
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await run_every_pass(FanoutProcessor.on(storage, writer, timing=TIMING), message)
    await Sweeper(storage, claim_lifetime_s=LIFETIME_S).sweep(
        now=time.time() + LIFETIME_S + GRACE_S + 120
    )


class StallAfterSend(FanoutQueue):
    """The API request stalls between its send and its write while ``during`` runs."""

    def __init__(
        self, storage: Storage, during: Callable[[FanoutMessage], Awaitable[None]]
    ) -> None:
        super().__init__(storage)
        self._during = during

    async def send(self, message: FanoutMessage) -> None:
        await super().send(message)
        await self._during(message)


async def test_a_stalled_follow_write_is_refused_after_its_claim_is_swept(own: Storage) -> None:
    repos = Repositories.on(own)
    author, reader = unique("a"), unique("r")
    await add_users(repos, author, reader)
    stalled = Followed(follower=reader, subject=author, requested=now_ticks())
    await _give_up_and_sweep(own, stalled)
    with pytest.raises(ArrivalWindowPassedError):
        await repos.follows.add(
            reader,
            author,
            datetime.now(UTC),
            request=request_id(reader, stalled.requested),
            not_after=arrival_deadline(stalled.requested, WINDOW_S),
        )
    assert not await repos.follows.is_following(reader, author)


async def test_a_stalled_post_write_is_refused_after_its_void_row_is_swept(own: Storage) -> None:
    repos = Repositories.on(own)
    author = unique("a")
    post_id = new_post_id(now_ticks())
    await _give_up_and_sweep(own, PostCreated(author=author, post_id=post_id))
    with pytest.raises(ArrivalWindowPassedError):
        await repos.posts.add(
            Post(post_id=post_id, author=author, text="late"),
            not_after=arrival_deadline(post_id_ticks(post_id), WINDOW_S),
        )
    assert await repos.posts.get(author, post_id) is None


@pytest.mark.parametrize("change", ["follow", "unfollow", "post"])
async def test_the_api_refuses_a_write_stalled_past_the_window_with_a_retryable_503(
    own: Storage, change: str
) -> None:
    repos = Repositories.on(own)
    author, reader = unique("a"), unique("r")
    await add_users(repos, author, reader)
    await add_posts(repos, author, 2)
    if change == "unfollow":
        await add_follow(repos, reader, author)
    service = unlimited_service(
        own, StallAfterSend(own, lambda m: _give_up_and_sweep(own, m)), arrival_window_s=WINDOW_S
    )
    request: Callable[[], Awaitable[object]] = {
        "follow": lambda: service.follows.follow(reader, reader, author),
        "unfollow": lambda: service.follows.unfollow(reader, reader, author),
        "post": lambda: service.posts.create(author, author, "late"),
    }[change]
    with pytest.raises(ArrivalWindowPassedError) as refused:
        await request()
    assert status_for(refused.value) == 503
    assert refused.value.code == "arrival_window_passed"
    assert refused.value.retry_after > 0
    assert await repos.follows.is_following(reader, author) == (change == "unfollow")
    assert len((await repos.posts.page(author, 10, None)).items) == 2
    assert await timeline_ids(repos, reader) == []
