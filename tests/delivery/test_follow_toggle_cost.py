"""A follow toggled again and again costs a few storage writes per follow/unfollow pair,
not a 250-post backfill and two purges each, and the timeline is still exactly right."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.conftest import eventually, make_settings, running_worker, unique
from tests.faults import StorageFront
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueues
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories

PAIRS = 10
WRITES_PER_PAIR = 25
"""The bound per damped pair: the API's writes (follow change, index sync: two per request)
and the worker's (an index sync per message), with room."""


async def _drained(storage: Storage) -> bool:
    work, _ = await FanoutQueues(storage).depth()
    return work == 0


async def test_toggling_a_follow_costs_a_few_writes_per_pair(
    front: StorageFront, tmp_path: Path
) -> None:
    """Every entity write of the API and the worker is counted at the front."""
    settings = make_settings(
        front.connection_string(),
        tmp_path,
        worker_write_deadline_s=1.0,
        storage_timeout_s=2.0,
        worker_sweep_delay_s=4.0,
        follow_cooldown_s=15.0,
        expiry_sweep_interval_s=0,
    )
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        repos = Repositories.on(storage)
        service = TimelineService(
            repos,
            FanoutQueues(storage),
            TokenSigner(b"test", token_ttl_s=3600),
            page_size=250,
            max_post_chars=280,
            limits=RateLimits.per_minute(storage, posts=0, writes=0, registrations=0),
            home=HomeTimeline(storage, max_merged=20),
        )
        author, reader = unique("a"), unique("r")
        for name in (author, reader):
            await repos.users.create(User(name, name, datetime.now(UTC)))
        posts = [
            await repos.posts.add(Post(new_post_id(now_ticks()), author, f"post {n}"))
            for n in range(250)
        ]
        follows = service.follows

        async def timeline() -> set[str]:
            page = await repos.timelines.page(reader, 1000, None)
            return {post.post_id for post in page.items}

        async with running_worker(settings):
            await follows.follow(reader, reader, author)
            await eventually(lambda: _holds(timeline, 250), what="the backfill")
            await follows.unfollow(reader, reader, author)  # quiet until now: purged at once
            await eventually(lambda: _holds(timeline, 0), what="the purge")
            await follows.follow(reader, reader, author)  # lost 250: copies 250
            await eventually(lambda: _holds(timeline, 250), what="the second backfill")

            front.written.clear()
            for _ in range(PAIRS):
                await follows.unfollow(reader, reader, author)
                await follows.follow(reader, reader, author)
            deleted = posts[-2:]
            for post in deleted:
                await service.posts.delete(author, author, post.post_id)
            await eventually(lambda: _drained(storage), timeout_s=60, what="every pass")
            written = sum(front.written.values())
            print(f"\n{PAIRS} toggle pairs: {written} entity writes {dict(front.written)}")
            assert written <= PAIRS * WRITES_PER_PAIR + 20  # the two deletes, with room
            live = {post.post_id for post in posts[:-2]}
            assert await timeline() == live  # following: every live post, no deleted one

            await follows.unfollow(reader, reader, author)
            await eventually(lambda: _holds(timeline, 0), timeout_s=60, what="the quiet purge")
            await eventually(lambda: _drained(storage), timeout_s=60, what="every pass")
            assert await timeline() == set()


async def _holds(timeline: Any, count: int) -> bool:
    return len(await timeline()) == count
