"""A follow's backfill and an unfollow's purge: neither undoes the other, short pages,
a backfill held back by the writer reads the follow again."""

from __future__ import annotations

import asyncio

from tests.conftest import eventually
from tests.delivery.helpers import (
    add_follow,
    author_and_reader,
    feed_on,
    remove_follow,
    timeline_ids,
)
from tests.faults import StorageFront
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import DONE, Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.model.messages import Followed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def test_purge_keeps_a_refollows_backfill(front: StorageFront, fronted: Storage) -> None:
    repos = Repositories.on(fronted)
    author, reader, posts = await author_and_reader(repos, 3)
    async with PartitionWriter(fronted, TIMELINES, linger_s=0) as writer:
        prompt = FanoutProcessor.on(fronted, writer)
        await prompt.handle(Followed(follower=reader, subject=author))
        await remove_follow(repos, reader, author)
        async with PartitionWriter(fronted, TIMELINES, linger_s=0) as held_writer:
            front.hold_deletes.add(TIMELINES)
            purging = asyncio.create_task(feed_on(fronted, held_writer).purge(reader, author))
            await asyncio.wait_for(front.held.wait(), 10)  # read the rows, about to delete
            await add_follow(repos, reader, author)
            backfilled = await prompt.handle(Followed(follower=reader, subject=author))
            front.gate.set()
            await purging
        if isinstance(backfilled, Continue):  # damped (a re-follow): its second pass
            await prompt.handle(backfilled.message)
    assert sorted(await timeline_ids(repos, reader)) == sorted(post.post_id for post in posts)


async def test_backfill_reads_through_short_pages(front: StorageFront, fronted: Storage) -> None:
    repos = Repositories.on(fronted)
    author, reader, posts = await author_and_reader(repos, 20)
    async with PartitionWriter(fronted, TIMELINES, linger_s=0) as writer:
        front.page_limit = 7  # as real Azure may: short pages with a continuation
        await FanoutProcessor.on(fronted, writer).handle(Followed(follower=reader, subject=author))
    front.page_limit = None
    assert sorted(await timeline_ids(repos, reader)) == sorted(post.post_id for post in posts)


async def test_a_backfill_held_by_admission_reads_the_follow_again(storage: Storage) -> None:
    """The follow that justifies a backfill's copies is read inside their write deadline:
    one read before a long wait for the writer's backlog must not send copies of an author
    unfollowed meanwhile (a crash after such writes would leave them to unfollow passes that
    may already have run)."""
    repos = Repositories.on(storage)
    author, reader, _ = await author_and_reader(repos, posts=3)
    async with PartitionWriter(storage, TIMELINES) as writer:
        processor = FanoutProcessor(repos, writer)
        backlog = writer.admission(0.001, 10**9)  # hold the writer's admission closed
        await backlog.__aenter__()
        requests_before = writer.requests
        backfill = asyncio.create_task(processor.handle(Followed(follower=reader, subject=author)))

        async def waiting() -> bool:
            return writer.admission_waiters > 0

        await eventually(waiting, what="the backfill to wait for admission")
        await remove_follow(repos, reader, author)
        await backlog.__aexit__(None, None, None)
        assert await backfill == DONE
        assert writer.requests == requests_before, "copies sent on a follow read before the wait"
    assert await timeline_ids(repos, reader) == []
