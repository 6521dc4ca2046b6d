"""Shared set-up for the delivery tests: users, follows and posts written straight to the
tables, a home timeline's ids, and a service with no rate limits."""

from __future__ import annotations

from datetime import UTC, datetime

from azure.storage.queue import QueueMessage

from fanout_worker.metrics import MESSAGES
from tests.conftest import unique
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import Continue, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import FanoutMessage, encode, urgency
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.service.outbox import Outbox
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueue, Reservation
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories


def messages_counted(kind: str, outcome: str) -> float:
    return float(MESSAGES.labels(kind, outcome)._value.get())


async def add_users(repos: Repositories, *names: str) -> None:
    for name in names:
        await repos.users.create(User(name, name, created_at=datetime.now(UTC)))


async def add_follow(repos: Repositories, follower: str, subject: str) -> None:
    await repos.follows.add(follower, subject, datetime.now(UTC))
    await repos.follows.sync_index(follower, subject)


async def remove_follow(repos: Repositories, follower: str, subject: str) -> None:
    await repos.follows.remove(follower, subject)
    await repos.follows.sync_index(follower, subject)


async def add_posts(repos: Repositories, author: str, count: int) -> list[Post]:
    base = now_ticks()
    posts = [Post(new_post_id(base + i * 10), author, f"#{i}") for i in range(count)]
    for post in posts:
        await repos.posts.add(post)
    return posts


async def author_and_reader(repos: Repositories, posts: int = 1) -> tuple[str, str, list[Post]]:
    """An author, a reader who follows them, and the author's first ``posts`` posts."""
    author, reader = unique("author"), unique("reader")
    await add_users(repos, author, reader)
    await add_follow(repos, reader, author)
    return author, reader, await add_posts(repos, author, posts)


def feed_on(storage: Storage, writer: PartitionWriter) -> Feed:
    """Every write to a reader's timeline (a purge, say), as a ``FanoutProcessor`` has it."""
    return Feed(Context(Repositories.on(storage), writer))


async def timeline_ids(repos: Repositories, owner: str) -> list[str]:
    return [post.post_id for post in (await repos.timelines.page(owner, 1000, None)).items]


def unlimited_service(
    storage: Storage,
    queue: FanoutQueue | None = None,
    *,
    outbox: Outbox | None = None,
    home: HomeTimeline | None = None,
) -> TimelineService:
    return TimelineService(
        Repositories.on(storage),
        queue or FanoutQueue(storage),
        TokenSigner(b"test", token_ttl_s=3600),
        page_size=250,
        max_post_chars=280,
        limits=RateLimits.per_minute(storage, posts=0, writes=0, registrations=0),
        home=home or HomeTimeline(storage, max_merged=20),
        outbox=outbox,
    )


async def run_every_pass(worker: FanoutProcessor, message: FanoutMessage) -> None:
    """Every pass of a message, second passes at once (their delay is not under test)."""
    outcome: Outcome = await worker.handle(message)
    while isinstance(outcome, Continue):
        outcome = await worker.handle(outcome.message)


class Recorder(FanoutQueue):
    """Shard 0 of the real queue, keeping every message sent or reserved through it; with
    ``forward=False`` none reaches the queue, so the test decides when the worker sees it."""

    def __init__(self, storage: Storage, *, forward: bool = True) -> None:
        super().__init__(storage)
        self.sent: list[FanoutMessage] = []
        self._forward = forward

    async def send(self, message: FanoutMessage) -> None:
        self.sent.append(message)
        if self._forward:
            await super().send(message)

    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation:
        self.sent.append(message)
        if self._forward:
            return await super().reserve(message, hidden_s)
        return Reservation(self.lane(urgency(message)), QueueMessage(content=encode(message)))

    async def release(self, reservation: Reservation) -> None:
        if self._forward:
            await super().release(reservation)
