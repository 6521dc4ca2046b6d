"""Shared set-up for the hybrid fan-out interleavings: a processor with a small
threshold, messages run to the end, home timelines paged as readers page them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from tests.conftest import unique
from tests.delivery.helpers import add_follow, remove_follow
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.settings import Hybrid, Timing
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostCreated, Regrade
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.audience import COPIED, MERGE_COUNT_ROW, MERGED
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity

THRESHOLD = 4
HYBRID = Hybrid(threshold=THRESHOLD, max_merged=2, queue=None)
TIMING = Timing(write_deadline_s=1.0, sweep_delay_s=2.0)


async def new_users(repos: Repositories, *prefixes: str) -> list[str]:
    users = [unique(prefix) for prefix in prefixes]
    for user in users:
        await repos.users.create(User(user, user, created_at=datetime.now(UTC)))
    return users


async def merge_count(storage: Storage, reader: str) -> int:
    """The reader's count of merge rows, as its counter row stores it."""
    counter = await get_entity(storage, TIMELINES, reader, MERGE_COUNT_ROW)
    return 0 if counter is None else int(counter["n"])


async def run_to_end(processor: FanoutProcessor, message) -> None:  # type: ignore[no-untyped-def]
    """Handle a message and its continuations to the end, without the delays."""
    while True:
        outcome = await processor.handle(message)
        if not isinstance(outcome, Continue):
            return
        message = outcome.message


async def add_post(repos: Repositories, author: str, ticks: int | None = None) -> Post:
    post = Post(new_post_id(ticks if ticks is not None else now_ticks()), author, "x")
    await repos.posts.add(post)
    return post


async def home_pages(storage: Storage, reader: str, limit: int = 250) -> list[list[str]]:
    home = HomeTimeline(storage, max_merged=HYBRID.max_merged)
    pages: list[list[str]] = []
    position: Position | None = Position()
    while position is not None:
        posts, position = await home.page(reader, limit, position)
        pages.append([post.post_id for post in posts])
    return pages


async def sees_next_post(
    storage: Storage, processor: FanoutProcessor, author: str, fan: str
) -> None:
    """The author posts; the fan, who follows it, must see the post on its pages."""
    repos = Repositories.on(storage)
    post = await add_post(repos, author)
    await run_to_end(processor, PostCreated(author=author, post_id=post.post_id))
    assert await repos.follows.is_following(fan, author)
    merge_rows = await repos.audience.merged_authors(fan)
    overflow = await repos.audience.copy_etag(author, fan)
    shown = [p for page in await home_pages(storage, fan) for p in page]
    assert post.post_id in shown, (
        f"merged author's new post missing for a follower; merge rows={merge_rows} "
        f"overflow={overflow}"
    )


async def finish_down_then_up(
    storage: Storage, processor: FanoutProcessor, down: Regrade, others: list[str], fan: str
) -> None:
    """The redelivered move down runs to the end; the others follow again and the author
    moves up: the fan has a merge row again."""
    repos, author = Repositories.on(storage), down.author
    await run_to_end(processor, down)
    assert (await repos.audience.mode(author)).state == COPIED
    for user in others:
        await add_follow(repos, user, author)
    await regrade(processor, author, merge=True)
    assert (await repos.audience.mode(author)).state == MERGED
    assert author in await repos.audience.merged_authors(fan)


async def move_down_then_check_gone(
    storage: Storage,
    processor: FanoutProcessor,
    author: str,
    others: list[str],
    fan: str,
    deleted: str,
) -> None:
    """The other followers leave, the author moves down: the deleted post must not show."""
    repos = Repositories.on(storage)
    for user in others:
        await remove_follow(repos, user, author)
    await regrade(processor, author, merge=False)
    assert (await repos.audience.mode(author)).state == COPIED
    assert await repos.posts.get(author, deleted) is None
    shown = [p for page in await home_pages(storage, fan) for p in page]
    assert deleted not in shown, "a deleted post is back in the follower's timeline"


def hybrid_processor(storage: Storage, writer: PartitionWriter) -> FanoutProcessor:
    return FanoutProcessor.on(storage, writer, hybrid=HYBRID, timing=TIMING)


async def regrade(processor: FanoutProcessor, author: str, merge: bool) -> Regrade:
    message = Regrade(author=author, merge=merge, token=uuid.uuid4().hex)
    await run_to_end(processor, message)
    return message


def pause_after_first_call(
    owner: object, method: str, reached: asyncio.Event, resume: asyncio.Event
) -> None:
    """Replace ``owner.method`` by one whose first answer sets ``reached`` and is held until
    ``resume`` is set."""
    call: Callable[..., Awaitable[Any]] = getattr(owner, method)

    async def paused(*args: Any) -> Any:
        result = await call(*args)
        if not reached.is_set():
            reached.set()
            await resume.wait()
        return result

    setattr(owner, method, paused)
