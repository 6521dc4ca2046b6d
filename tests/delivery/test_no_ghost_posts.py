"""A post either exists and is delivered, or is nowhere: a lost send answer, a crash at
the send, a voided post id."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import eventually, make_settings, opened, running_worker, unique
from tests.delivery.helpers import add_follow, add_posts, add_users, timeline_ids, unlimited_service
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import StorageUnavailableError
from timeline.model.messages import FanoutMessage
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


class _SendThenFail(FanoutQueue):
    """A send that reached the queue (and was even processed) but whose answer was lost."""

    def __init__(self, storage: Storage, processor: FanoutProcessor) -> None:
        super().__init__(storage)
        self._processor = processor

    async def send(self, message: FanoutMessage) -> None:
        await super().send(message)
        await self._processor.handle(message)
        raise StorageUnavailableError("injected: the answer to the send was lost", retry_after=1)


class _CrashOnSend(FanoutQueue):
    async def send(self, message: FanoutMessage) -> None:
        raise RuntimeError("injected: the API process died here")


async def _no_ghost(repos: Repositories, author: str, reader: str) -> None:
    """A post either exists and is delivered, or is nowhere; counted exactly."""
    posts = [post.post_id for post in (await repos.posts.page(author, 100, None)).items]
    assert await timeline_ids(repos, reader) == posts
    user = await repos.users.get(author)
    assert user is not None
    assert user.posts == len(posts)


async def test_lost_send_answer_leaves_no_ghost(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage, PartitionWriter(storage, TIMELINES) as writer:
        repos = Repositories.on(storage)
        author, reader = unique("author"), unique("reader")
        await add_users(repos, author, reader)
        await add_follow(repos, reader, author)
        processor = FanoutProcessor.on(storage, writer, timing=settings.fanout_timing())
        service = unlimited_service(storage, _SendThenFail(storage, processor))
        with pytest.raises(StorageUnavailableError):
            await service.posts.create(author, author, "lost")
        async with running_worker(settings):
            await eventually(lambda: _queue_drained(storage), timeout_s=30, what="the queue")
        await _no_ghost(repos, author, reader)


async def test_crash_at_send_leaves_no_ghost(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        repos = Repositories.on(storage)
        author, reader = unique("author"), unique("reader")
        await add_users(repos, author, reader)
        await add_follow(repos, reader, author)
        with pytest.raises(RuntimeError):
            await unlimited_service(storage, _CrashOnSend(storage)).posts.create(
                author, author, "x"
            )
        async with running_worker(settings):
            await eventually(lambda: _queue_drained(storage), timeout_s=30, what="the queue")
        await _no_ghost(repos, author, reader)


async def _queue_drained(storage: Storage) -> bool:
    return (await FanoutQueue(storage).depth()) == (0, 0)


async def test_a_voided_post_id_is_not_a_surviving_post(repos: Repositories) -> None:
    """A late message for a deleted post may claim its id as void; the claim is no post."""
    author = unique("author")
    [post] = await add_posts(repos, author, 1)
    assert await repos.posts.delete(author, post.post_id)
    assert await repos.posts.void(author, post.post_id)
    assert await repos.posts.surviving(author, [post]) == set()
    assert await repos.posts.get(author, post.post_id) is None
    assert (await repos.posts.page(author, 10, None)).items == []
