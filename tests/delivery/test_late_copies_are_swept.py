"""A delivery that dies after buffering its copies, whose copies land after a delete or
an unfollow has run its first pass: the second pass sweeps them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from tests.conftest import eventually, running_worker
from tests.delivery.helpers import author_and_reader, messages_counted, remove_follow, timeline_ids
from timeline.config import Settings
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.model.entities import Post
from timeline.model.messages import PostCreated, PostDeleted, Unfollowed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories


async def _crash_after_write(storage: Storage, held: PartitionWriter, post: Post) -> None:
    """Run a delivery until its copies are buffered, then kill it before its re-check: the
    copies are still in flight (they land when ``held`` is flushed), nothing undoes them."""
    delivering = FanoutProcessor.on(storage, held)
    task = asyncio.create_task(
        delivering.handle(PostCreated(author=post.author, post_id=post.post_id))
    )

    async def buffered() -> bool:
        return held.buffered > 0

    await eventually(buffered, timeout_s=10, what="the delivery's copies to be buffered")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _quick_sweeps(settings: Settings) -> Settings:
    """A worker whose second passes come soon (its own writes are small and quick)."""
    return settings.model_copy(update={"worker_write_deadline_s": 1.5, "worker_sweep_delay_s": 7.0})


async def _first_pass_done(kind: str, before: float) -> None:
    async def rewritten() -> bool:
        return messages_counted(kind, "continue") > before

    await eventually(rewritten, timeout_s=20, what=f"the {kind}'s first pass")


async def _late_copy(
    storage: Storage, held: PartitionWriter, post: Post, kind: str, interfere: Awaitable[None]
) -> None:
    """A delivery dies after buffering its copy; ``interfere`` (a delete or an unfollow) runs
    its first pass; only then does the dead delivery's copy land."""
    await _crash_after_write(storage, held, post)
    before = messages_counted(kind, "continue")
    await interfere
    await _first_pass_done(kind, before)
    await held.flush()


async def test_copy_landing_after_delete_and_crash_is_swept(
    settings: Settings, storage: Storage, repos: Repositories, queue: FanoutQueue
) -> None:
    author, reader, [post] = await author_and_reader(repos)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        running_worker(_quick_sweeps(settings)),
    ):
        deleting = queue.send(PostDeleted(author=author, post_id=post.post_id))
        await _late_copy(storage, held, post, "delete", deleting)
        assert await timeline_ids(repos, reader) == [post.post_id]

        async def swept() -> bool:
            return (
                await timeline_ids(repos, reader) == [] and await timeline_ids(repos, author) == []
            )

        await eventually(swept, timeout_s=30, what="the delete's second pass")
    assert await repos.posts.get(author, post.post_id) is None


async def test_copy_landing_after_unfollow_and_crash_is_swept(
    settings: Settings, storage: Storage, repos: Repositories, queue: FanoutQueue
) -> None:
    author, reader, [post] = await author_and_reader(repos)

    async def unfollowing() -> None:
        await queue.send(Unfollowed(follower=reader, subject=author))
        await remove_follow(repos, reader, author)

    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        running_worker(_quick_sweeps(settings)),
    ):
        await _late_copy(storage, held, post, "unfollow", unfollowing())
        assert await timeline_ids(repos, reader) == [post.post_id]

        async def swept() -> bool:
            return await timeline_ids(repos, reader) == []

        await eventually(swept, timeout_s=30, what="the unfollow's second pass")
    assert await timeline_ids(repos, author) == [post.post_id]
