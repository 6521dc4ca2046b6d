"""A post either exists and is delivered, or is nowhere: a reservation whose answer was
lost, a crash at the reservation, a crash between the write and the release."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import eventually, make_settings, opened, running_worker, unique
from tests.delivery.helpers import add_follow, add_users, timeline_ids, unlimited_service
from timeline.errors import StorageUnavailableError
from timeline.model.messages import FanoutMessage
from timeline.service.outbox import Outbox
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueue, Reservation
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

HIDDEN_S = 2
"""How long an unreleased message stays hidden here (a deployment's is 60 s)."""


class _ReserveThenFail(FanoutQueue):
    """A reservation that reached the queue but whose answer was lost."""

    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation:
        await super().reserve(message, hidden_s)
        raise StorageUnavailableError("injected: the answer to the send was lost", retry_after=1)


class _CrashOnReserve(FanoutQueue):
    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation:
        raise RuntimeError("injected: the API process died here")


class _NeverReleased(FanoutQueue):
    """The API process died between the write and the release."""

    async def release(self, reservation: Reservation) -> None:
        return None


async def _queue_drained(storage: Storage) -> bool:
    return (await FanoutQueue(storage).depth()) == (0, 0)


async def _no_ghost(repos: Repositories, author: str, reader: str) -> list[str]:
    """A post either exists and is delivered, or is nowhere; counted exactly."""
    posts = [post.post_id for post in (await repos.posts.page(author, 100, None)).items]
    assert await timeline_ids(repos, reader) == posts
    user = await repos.users.get(author)
    assert user is not None
    assert user.posts == len(posts)
    return posts


@pytest.mark.parametrize(
    ("queue", "error", "stored"),
    [
        (_ReserveThenFail, StorageUnavailableError, False),
        (_CrashOnReserve, RuntimeError, False),
        (_NeverReleased, None, True),
    ],
)
async def test_a_post_is_delivered_or_nowhere(
    private_azurite: Azurite,
    tmp_path: Path,
    queue: type[FanoutQueue],
    error: type[Exception] | None,
    stored: bool,
) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        repos = Repositories.on(storage)
        author, reader = unique("author"), unique("reader")
        await add_users(repos, author, reader)
        await add_follow(repos, reader, author)
        service = unlimited_service(storage, outbox=Outbox(queue(storage), hidden_s=HIDDEN_S))
        if error is None:
            await service.posts.create(author, author, "x")
        else:
            with pytest.raises(error):
                await service.posts.create(author, author, "x")
        async with running_worker(settings):
            await eventually(lambda: _queue_drained(storage), timeout_s=30, what="the queue")
        assert len(await _no_ghost(repos, author, reader)) == int(stored)
