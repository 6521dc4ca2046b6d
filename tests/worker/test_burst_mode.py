"""Burst mode: ``Worker.async_run(burst=True)`` returns only once every message is done,
including the continuations that messages in flight send (to either lane)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fanout_worker.worker import Worker
from tests.conftest import make_settings, opened
from tests.worker.helpers import author_with_followers, timeline_ids
from timeline.model.messages import PostCreated
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


async def test_burst_returns_once_every_page_is_delivered(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(
        private_azurite.connection_string, tmp_path, worker_follower_page_size=50
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        posts = [await author_with_followers(storage, repos, 230) for _ in range(2)]
        for author, post in posts:
            await queue.send(PostCreated(author=author, post_id=post.post_id))

        worker = Worker(settings, settings.connection_string())
        await asyncio.wait_for(worker.async_run(burst=True), 120)

        # returned early (before the later pages, queued while the first ran) fails here
        assert await queue.depth() == (0, 0)
        for author, post in posts:
            assert await timeline_ids(repos, author) == [post.post_id]
        for i in range(230):  # the two authors share the follower ids: both posts arrive
            assert sorted(await timeline_ids(repos, f"f{i:05d}")) == sorted(
                post.post_id for _, post in posts
            )

        idle = Worker(settings, settings.connection_string())
        await asyncio.wait_for(idle.async_run(burst=True), 30)  # nothing to do: returns
