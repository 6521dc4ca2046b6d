"""No crash at all: a reader toggling a follow while a delete is processed.

The delete's passes skip a reader who does not follow at that moment; the unfollow's passes
then find the reader following again. Every step is the API's or the worker's own code run to
completion; only the order in which messages are processed is chosen. Before the fix, each
pass left the copy of the deleted post to the other, for good.
"""

from __future__ import annotations

import asyncio

from tests.conftest import unique
from tests.delivery.helpers import Recorder, add_posts, add_users, timeline_ids, unlimited_service
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue, Done
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Timing
from timeline.model.messages import PostCreated
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories

TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=2.5)


async def test_refollow_during_delete_leaves_no_copy_of_the_deleted_post(
    storage: Storage, repos: Repositories
) -> None:
    author, reader = unique("author"), unique("reader")
    await add_users(repos, author, reader)
    recorder = Recorder(storage, forward=False)
    api = unlimited_service(storage, recorder)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer, timing=TIMING)
        await api.follows.follow(reader, reader, author)
        [post] = await add_posts(repos, author, 1)
        await worker.handle(PostCreated(author=author, post_id=post.post_id))
        assert await timeline_ids(repos, reader) == [post.post_id]
        await api.follows.unfollow(reader, reader, author)
        await api.posts.delete(author, author, post.post_id)
        first_unfollow, delete = recorder.sent[-2:]
        first = await worker.handle(delete)  # the delete's first pass: reader skipped
        assert isinstance(first, Continue)
        await api.follows.follow(reader, reader, author)
        await worker.handle(recorder.sent[-1])  # the re-follow's backfill: the post is gone
        assert isinstance(await worker.handle(first_unfollow), Continue)  # following again
        await api.follows.unfollow(reader, reader, author)
        await asyncio.sleep(TIMING.sweep_delay_s)
        assert isinstance(await worker.handle(first.message), Done)  # reader skipped again
        await api.follows.follow(reader, reader, author)
        await worker.handle(recorder.sent[-1])
    assert await timeline_ids(repos, reader) == []
