"""Helpers shared by the reposts and replies tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from tests.conftest import eventually, unique
from tests.delivery.helpers import add_follow, add_posts, add_users
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import FanoutMessage, Reposted, Unreposted
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page
from timeline.storage.names import POSTS
from timeline.tables.repositories import Repositories


async def people(repos: Repositories, *prefixes: str) -> list[str]:
    """New users, one per prefix."""
    names = [unique(prefix) for prefix in prefixes]
    await add_users(repos, *names)
    return names


def unreposted(message: Reposted) -> Unreposted:
    """The un-repost of ``message``."""
    return Unreposted(**message.model_dump(include={"reposter", "author", "post_id", "repost_id"}))


async def to_the_end(worker: FanoutProcessor, message: FanoutMessage) -> None:
    """Run a message and every pass it continues with, delayed ones included."""
    outcome: Outcome = await worker.handle(message)
    while isinstance(outcome, Continue):
        outcome = await worker.handle(outcome.message)


async def hold_then_release(
    writer: PartitionWriter, work: Awaitable[object], interfere: Awaitable[object]
) -> object:
    """Run ``work`` until its writes are buffered in ``writer``, run ``interfere`` to the end
    (its result is returned), then let the held writes (and the re-check's) go out until
    ``work`` finishes (or raises)."""
    task = asyncio.ensure_future(work)

    async def buffered() -> bool:
        return writer.buffered > 0

    await eventually(buffered, timeout_s=10, what="the held writes to be buffered")
    result = await interfere
    while not task.done():
        await writer.flush()
        await asyncio.sleep(0.01)
    await task
    return result


async def posts_keys(storage: Storage, partition: str, prefix: str) -> list[str]:
    """The row keys in a ``posts`` partition that start with ``prefix`` (index and repost
    rows: ``~rpof-``, ``~rp-``, ``~re-``)."""
    page = await query_page(
        storage.reader(POSTS, partition),
        "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
        {"pk": partition, "low": prefix, "high": prefix[:-1] + "."},
        select=["RowKey"],
        limit=1000,
        continuation=None,
    )
    return [str(row["RowKey"]) for row in page.items]


async def shown(repos: Repositories, owner: str) -> list[tuple[str, str | None]]:
    """``(post shown, reposted_by)`` of each entry of the timeline, newest first."""
    page = await repos.timelines.page(owner, 1000, None)
    return [(post.original or post.post_id, post.reposted_by) for post in page.items]


async def reposter_with_readers(
    repos: Repositories, followers: int
) -> tuple[str, str, list[str], str]:
    """An author's post, and a reposter with ``followers`` readers."""
    author, reposter = unique("author"), unique("reposter")
    readers = [unique("reader") for _ in range(followers)]
    await add_users(repos, author, reposter, *readers)
    for reader in readers:
        await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    return author, reposter, readers, post.post_id


async def stored_repost(repos: Repositories, reposter: str, author: str, post_id: str) -> Reposted:
    """A repost request that files its index row and writes its row (its message queued)."""
    ticks = now_ticks()
    message = Reposted(
        reposter=reposter, author=author, post_id=post_id, repost_id=new_post_id(ticks)
    )
    await repos.reposts.note_index(author, post_id, reposter, message.repost_id)
    await repos.reposts.create(reposter, author, post_id, message.repost_id)
    return message
