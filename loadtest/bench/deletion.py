"""An account's deletion: what deleting a user with ``delete_followers`` followers,
``delete_follows`` follows, ``delete_posts`` posts (the newest ``delete_copies_each`` of them
in every follower's timeline) and ``delete_reposts`` reposts of its posts by others costs.

In process: a ``FanoutProcessor`` built as the worker builds it, whose messages (the
deletion's and every one it sends) are run here one after another, second passes at once
(their waits, ``account_every_s`` and ``sweep_delay_s``, are protocol delays, not work).
``account_delete_s`` is the seconds that work took, ``account_delete_requests`` the storage
requests it made (this process's ``timeline_storage_requests_total``), and
``account_delete_messages`` the messages it ran (``account_delete_copies``: the copies
of its posts in followers' timelines it removed). The end is checked: no follower's
timeline holds a post of the user, and only the tombstone names it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY

from loadtest.bench.api import REQUESTS
from loadtest.bench.harness import TEXT, fresh_storage, write_rows
from loadtest.bench.sizes import Sizes
from timeline.config import Settings
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor, worker_writer
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import AccountDeleted, FanoutMessage
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES
from timeline.tables.repositories import Repositories

USER = "leaving"


class _Collected:
    """A ``MessageSender`` that keeps what the processor sends, to run it here."""

    def __init__(self) -> None:
        self.sent: list[FanoutMessage] = []

    async def send(self, message: FanoutMessage) -> None:
        self.sent.append(message)


async def deletion(sizes: Sizes) -> dict[str, Any]:
    async with fresh_storage() as (_azurites, storage):
        repos = Repositories.on(storage)
        await _seed(storage, repos, sizes)
        await repos.users.tombstone(USER)
        await repos.users.delete_profile(USER)
        settings = Settings()
        collected = _Collected()
        async with worker_writer(storage, settings) as writer:
            processor = FanoutProcessor.configured(storage, writer, settings, queue=collected)
            before, started = _requests(), time.perf_counter()
            messages = await _run(processor, collected, AccountDeleted(user=USER))
            seconds = time.perf_counter() - started
            requests = _requests() - before
        await _check(storage, repos, sizes)
    return {
        "account_delete_s": seconds,
        "account_delete_requests": requests,
        "account_delete_messages": float(messages),
        "account_delete_copies": float(sizes.delete_followers * sizes.delete_copies_each),
    }


async def _seed(storage: Storage, repos: Repositories, sizes: Sizes) -> None:
    """The user, its followers (each with the user's posts in its timeline), its follows,
    its posts, and reposts of its posts by others (filed in the posts' index)."""
    await repos.users.create(User(USER, USER, created_at=datetime.now(UTC)))
    since = datetime.now(UTC)
    fans = [f"df{i:05d}" for i in range(sizes.delete_followers)]
    followed = [f"dg{i:05d}" for i in range(sizes.delete_follows)]
    follows = [{"PartitionKey": USER, "RowKey": f, "since": since} for f in fans]
    follows += [{"PartitionKey": s, "RowKey": USER, "since": since} for s in followed]
    await write_rows(storage, SUBJECT_FOLLOWERS, follows, "deletion: follows")
    index = [{"PartitionKey": f, "RowKey": USER, "since": since, "active": True} for f in fans]
    index += [{"PartitionKey": USER, "RowKey": s, "since": since, "active": True} for s in followed]
    await write_rows(storage, SUBJECT_FOLLOWING, index, "deletion: index")
    base = now_ticks() - sizes.delete_posts * 10_000_000
    posts = [
        await repos.posts.add(Post(new_post_id(base + i * 10_000_000), USER, TEXT))
        for i in range(sizes.delete_posts)
    ]
    copies = [post.to_entity(fan) for fan in fans for post in posts[-sizes.delete_copies_each :]]
    await write_rows(storage, TIMELINES, copies, "deletion: copies")
    for i in range(sizes.delete_reposts):
        reposter, post = f"dr{i:05d}", posts[i % len(posts)]
        repost_id = new_post_id(now_ticks())
        await repos.reposts.note_index(USER, post.post_id, reposter, repost_id)
        await repos.reposts.create(reposter, USER, post.post_id, repost_id)


async def _run(processor: FanoutProcessor, collected: _Collected, first: FanoutMessage) -> int:
    """Run ``first`` and everything it leads to, one message at a time; how many ran."""
    work, ran = [first], 0
    while work:
        outcome = await processor.handle(work.pop(0))
        ran += 1
        if isinstance(outcome, Continue):
            work.append(outcome.message)
        work += collected.sent
        collected.sent.clear()
    return ran


async def _check(storage: Storage, repos: Repositories, sizes: Sizes) -> None:
    """Nothing of the user left in a follower's timeline, and no follow or post of it."""
    for i in range(0, sizes.delete_followers, max(1, sizes.delete_followers // 20)):
        page = await repos.timelines.page(f"df{i:05d}", 1000, None)
        assert not [p for p in page.items if p.author == USER], i
    assert await repos.users.undone(USER)
    assert await repos.users.deletions() == []


def _requests() -> float:
    return REGISTRY.get_sample_value(REQUESTS) or 0.0
