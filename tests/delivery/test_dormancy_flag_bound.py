"""A dormancy mark is sent within the window of the marker read or not at all: the wait for a
place in the storage limiter (untimed back-pressure) does not stretch it, so every mark ends
within one storage timeout (the client's retries included) of the window's end."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import storage_on, unique
from tests.delivery.helpers import add_follow, add_users
from timeline.errors import StorageUnavailableError
from timeline.storage.flow.limiter import AdaptiveLimiter, LimiterSettings
from timeline.storage.names import SUBJECT_FOLLOWERS
from timeline.tables.follows import INACTIVE
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity
from timeline.tools.azurite import Azurite


async def test_a_mark_that_waited_past_its_window_for_a_limiter_place_is_not_sent(
    private_azurite: Azurite,
) -> None:
    limiter = AdaptiveLimiter(LimiterSettings(initial=1, minimum=1, maximum=1))
    async with storage_on([private_azurite], limiter=limiter) as storage:
        await storage.create_all()
        repos = Repositories.on(storage)
        reader, author = unique("reader"), unique("author")
        await add_users(repos, reader, author)
        await add_follow(repos, reader, author)
        read = await repos.activity.follow_row(author, reader)
        assert read is not None
        held, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with limiter.slot():
                held.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await held.wait()
        not_after = time.monotonic()  # the window ends while the mark waits for its place
        flag = repos.activity.flag(author, reader, read, "g", 0.0, not_after=not_after)
        mark = asyncio.create_task(flag)
        await asyncio.sleep(0)  # the mark is waiting for the place
        release.set()
        await holder
        with pytest.raises(StorageUnavailableError):
            await mark
        row = await get_entity(storage, SUBJECT_FOLLOWERS, author, reader)
        assert row is not None
        assert not row.get(INACTIVE), "a mark was sent past its window"
