"""Storage trouble delays work but never loses or poisons it: outages, message expiry,
lease renewals behind hung table calls."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.conftest import eventually, make_settings, opened, running_worker
from tests.delivery.helpers import author_and_reader, messages_counted, timeline_ids
from tests.faults import StorageFront
from tests.helpers import visible_work
from timeline.model.messages import PostCreated, PostDeleted
from timeline.storage.accounts import Storage
from timeline.storage.names import META_TABLE, USERS
from timeline.storage.placement import PLACEMENT_TABLE
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


async def test_storage_trouble_never_poisons(front: StorageFront, tmp_path: Path) -> None:
    settings = make_settings(
        front.connection_string(),
        tmp_path,
        worker_visibility_timeout_s=1,
        worker_max_deliveries=1,
        storage_timeout_s=1,
        storage_retries=0,
    )
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, reader, [post] = await author_and_reader(repos)
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        deferred = messages_counted("post", "defer")

        async def deferred_often() -> bool:
            return messages_counted("post", "defer") >= deferred + 4

        # Every table call fails, as in an outage; the placement (and the service-wide rows
        # beside it) still answer, so the worker knows its queues and takes work.
        front.down, front.answering = True, {PLACEMENT_TABLE, META_TABLE}
        async with running_worker(settings):
            await eventually(deferred_often, timeout_s=60, what="four leases lost to storage")
        front.down = False
        assert (await queue.depth())[1] == 0, "storage trouble poisoned a message"
        async with running_worker(settings):

            async def delivered() -> bool:
                return await timeline_ids(repos, reader) == [post.post_id]

            await eventually(delivered, timeout_s=30, what="delivery once storage is back")
        assert (await queue.depth())[1] == 0


async def test_work_messages_never_expire(private_azurite: Azurite, tmp_path: Path) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(PostDeleted(author="a", post_id="0" * 26))
        [message] = await visible_work(queue)
        assert message.expires_on is not None
        assert message.expires_on.year == 9999


async def test_lease_renewals_do_not_wait_behind_table_calls(
    front: StorageFront, tmp_path: Path
) -> None:
    """Table calls that hang (a slow account) hold every table connection; queue calls (lease
    renewals) have their own pool and still answer."""
    settings = make_settings(front.connection_string(), tmp_path, storage_timeout_s=5)
    async with (
        opened(settings),
        # one with no queue connection yet (an idle one would be reused from any pool)
        Storage(settings.connection_string(), settings.storage_options()) as storage,
    ):
        queue = FanoutQueue(storage)
        front.hang = True
        repos = Repositories.on(storage)
        table_calls = [asyncio.create_task(repos.users.exists(f"u{i}")) for i in range(300)]

        async def pool_full() -> bool:
            return front.holding[USERS] == storage.options.table_connections

        await eventually(pool_full, timeout_s=10, what="the table connections to hang")
        assert await queue.depth() == (0, 0)
        assert not any(task.done() for task in table_calls), "queue call waited for the tables"
        for task in table_calls:
            task.cancel()
        await asyncio.gather(*table_calls, return_exceptions=True)
