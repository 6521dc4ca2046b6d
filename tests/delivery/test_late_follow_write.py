"""An API follow or unfollow whose write comes after the arrival window.

The API sends Followed/Unfollowed, then stalls (slow storage, a paused process, a request
that storage executes late) for longer than the arrival window. The worker gives the request
up by claiming it; the late write then fails (503 to the client) and changes nothing, so the
state and the timelines agree. Before the claim, the late write landed with no fan-out.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import eventually, running_worker, unique
from tests.delivery.helpers import (
    add_posts,
    add_users,
    author_and_reader,
    timeline_ids,
    unlimited_service,
)
from timeline.config import Settings
from timeline.errors import StorageUnavailableError
from timeline.model.messages import FanoutMessage
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories

STALL_S = 8.0  # > arrival window (3 s in the test settings) + the deferral backoff


class StallAfterSend(FanoutQueue):
    async def send(self, message: FanoutMessage) -> None:
        await super().send(message)
        await asyncio.sleep(STALL_S)  # the API request is slow between its send and its write


async def _drained(storage: Storage) -> bool:
    return (await FanoutQueue(storage).depth())[0] == 0


async def test_late_follow_is_never_backfilled(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader = unique("author"), unique("reader")
    await add_users(repos, author, reader)
    posts = await add_posts(repos, author, 3)
    async with running_worker(settings):
        with pytest.raises(StorageUnavailableError):
            await unlimited_service(storage, StallAfterSend(storage)).follows.follow(
                reader, reader, author
            )
        await eventually(lambda: _drained(storage), timeout_s=30, what="queue drained")
    assert not await repos.follows.is_following(reader, author)
    assert await timeline_ids(repos, reader) == []
    assert len(posts) == 3


async def test_late_unfollow_is_never_purged(
    settings: Settings, storage: Storage, repos: Repositories
) -> None:
    author, reader, posts = await author_and_reader(repos, 3)
    await repos.timelines.put_many(reader, posts)  # the earlier backfill
    async with running_worker(settings):
        with pytest.raises(StorageUnavailableError):
            await unlimited_service(storage, StallAfterSend(storage)).follows.unfollow(
                reader, reader, author
            )
        await eventually(lambda: _drained(storage), timeout_s=30, what="queue drained")
    assert await repos.follows.is_following(reader, author)
    assert sorted(await timeline_ids(repos, reader)) == sorted(p.post_id for p in posts)
