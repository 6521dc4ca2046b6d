"""Lists: what a list holding an author adds to the fan-out of each of the author's posts, and
what reading a list's timeline costs beside reading a home timeline.

Delivery, in process (a ``FanoutProcessor`` built as the worker builds it, counted by this
process's ``timeline_storage_requests_total``): ``list_posts`` posts of an author with
``list_followers`` followers, each delivered to the end, one after another; then the author
joins ``list_count`` lists (of as many owners) and the same posts are delivered again. A
delivery is idempotent (the same copies, and the same timelines trimmed, since a trim is
chosen by a hash of timeline and post), so the second round's requests beyond the first are
the lists' copies and their trims: per post and per list, ``list_delivery_requests_per_post``.

Reads, through a real API: one owner's list whose timeline holds the same entries as the
owner's home timeline; first pages of 250 of each, read alternately (``list_read_p50_ms``,
``home_read_p50_ms``, ``list_read_p50_ratio``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY

from loadtest.bench.api import PAGE, REQUESTS, SECRET, api_process
from loadtest.bench.harness import TEXT, follower_rows, fresh_storage, write_rows
from loadtest.bench.measure import quantile
from loadtest.bench.sizes import Sizes
from timeline.config import Settings
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor, worker_writer
from timeline.model.entities import Post
from timeline.model.keys import list_reader, new_post_id, now_ticks
from timeline.model.messages import FanoutMessage, PostCreated
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, TIMELINES
from timeline.tables.follows import FollowsRepository
from timeline.tables.lists import ListsRepository
from timeline.tables.timelines import TimelinesRepository


async def lists(sizes: Sizes) -> dict[str, Any]:
    async with fresh_storage() as (azurites, storage):
        delivery = await _delivery(storage, sizes)
        owner, list_id = await _seed_reads(storage)
        signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
        headers = {"Authorization": f"Bearer {signer.mint_bearer(owner)}"}
        async with api_process(azurites) as server:

            async def first_page(path: str) -> tuple[float, list[str]]:
                started = time.perf_counter()
                async with server.session.get(f"{server.base}{path}", headers=headers) as response:
                    items = (await response.json())["items"]
                assert len(items) == PAGE, len(items)
                return 1000 * (time.perf_counter() - started), [i["post_id"] for i in items]

            home = f"/users/{owner}/timeline"
            listed = f"/users/{owner}/lists/{list_id}/timeline"
            _, home_ids = await first_page(home)  # warm each; the same page from both
            _, list_ids = await first_page(listed)
            assert home_ids == list_ids
            home_ms: list[float] = []
            list_ms: list[float] = []
            for _ in range(sizes.list_reads):
                home_ms.append((await first_page(home))[0])
                list_ms.append((await first_page(listed))[0])
    return delivery | {
        "list_read_p50_ms": quantile(list_ms, 0.5),
        "home_read_p50_ms": quantile(home_ms, 0.5),
        "list_read_p50_ratio": quantile(list_ms, 0.5) / quantile(home_ms, 0.5),
    }


async def _delivery(storage: Storage, sizes: Sizes) -> dict[str, float]:
    """An author's posts delivered, then delivered again once it is in ``list_count`` lists
    (a delivery is idempotent: the same copies, the same trims of the same timelines); the
    requests the second round spent beyond the first, per post and per list."""
    settings = Settings()
    author = "listedauthor"
    fans = [f"lf{i:05d}" for i in range(sizes.list_followers)]
    await write_rows(storage, SUBJECT_FOLLOWERS, follower_rows(author, fans), "lists: followers")
    base = now_ticks()
    posts = [
        Post(new_post_id(base + i * 10_000_000), author, TEXT) for i in range(sizes.list_posts)
    ]
    await write_rows(storage, POSTS, [p.to_entity(author) for p in posts], "lists: posts")
    async with worker_writer(storage, settings) as writer:
        processor = FanoutProcessor.configured(storage, writer, settings)
        without = await _deliver(processor, posts)
        follows, repository = FollowsRepository(storage), ListsRepository(storage)
        readers: list[str] = []
        for i in range(sizes.list_count):
            owner = f"lo{i:04d}"
            made = await repository.create(owner, "bench", False, settings.max_lists)
            assert made is not None
            readers.append(list_reader(owner, made.list_id))
            await follows.add(readers[-1], author, datetime.now(UTC))
            await follows.sync_index(readers[-1], author)
        with_lists = await _deliver(processor, posts)
    timelines = TimelinesRepository(storage)
    for reader in readers:  # every list holds every post: the copies counted were written
        held = await timelines.page(reader, 1000, None)
        assert len(held.items) == len(posts), (reader, len(held.items))
    extra = (with_lists - without) / (sizes.list_posts * sizes.list_count)
    return {"list_delivery_requests_per_post": extra}


async def _deliver(processor: FanoutProcessor, posts: list[Post]) -> float:
    """Deliver each post to the end, one after another; the storage requests it took."""
    before = _requests()
    for post in posts:
        message: FanoutMessage = PostCreated(author=post.author, post_id=post.post_id)
        while isinstance(outcome := await processor.handle(message), Continue):
            message = outcome.message
    return _requests() - before


async def _seed_reads(storage: Storage) -> tuple[str, str]:
    """An owner whose list's timeline holds the same 3 pages of entries as its home timeline;
    the owner and the list's id."""
    owner = "listreader"
    made = await ListsRepository(storage).create(owner, "bench", False, Settings().max_lists)
    assert made is not None
    reader = list_reader(owner, made.list_id)
    base = now_ticks() - 3 * PAGE * 10_000_000
    posts = [Post(new_post_id(base + i * 10_000_000), "f", TEXT) for i in range(3 * PAGE)]
    copies = [post.to_entity(partition) for partition in (owner, reader) for post in posts]
    await write_rows(storage, TIMELINES, copies, "lists: seeding timelines")
    return owner, made.list_id


def _requests() -> float:
    """Storage requests this process has made (every guarded call)."""
    return REGISTRY.get_sample_value(REQUESTS) or 0.0
