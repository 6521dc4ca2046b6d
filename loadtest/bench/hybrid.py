"""Hybrid fan-out: a post of an author with a huge audience, home timeline reads that merge
large authors against plain reads in the same run, and the cost of moving an author across
the threshold.

The large author's audience is seeded as it stands after a ``Regrade`` (follower rows and
count, the author's mode row, and merge rows for the sampled followers, written through
``AudienceRepository``); what the move itself costs per follower is measured separately, on
a smaller audience, by a real ``Regrade``."""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from loadtest.bench.api import SECRET, api_process
from loadtest.bench.harness import TEXT, bounded, follower_rows, fresh_storage, worker, write_rows
from loadtest.bench.measure import quantile
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Regrade
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES
from timeline.storage.queue import FanoutQueues
from timeline.tables.audience import MERGED, AudienceRepository, AuthorMode
from timeline.tables.counters import shard_key

SAMPLED = 100
MERGED_AUTHORS = 5
PAGE = 250
VISIBILITY_READERS = 8
"""Sampled followers reading at once: like people refreshing, not a flood that would measure
the API's queue instead of the post's path."""
POST_SPACING_TICKS = 10_000_000
"""One second between seeded entries of a reader's own timeline."""


async def hybrid(sizes: Sizes) -> dict[str, Any]:
    return await _large_post_and_reads(sizes) | await _regrade(sizes)


async def _large_post_and_reads(sizes: Sizes) -> dict[str, Any]:
    signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
    large = "celebrity"
    fans = [f"fan{i:07d}" for i in range(sizes.large_author_followers)]
    sampled = fans[:: max(1, len(fans) // SAMPLED)][:SAMPLED]
    async with fresh_storage() as (azurites, storage):
        audience = AudienceRepository(storage)
        await _seed_audience(storage, large, fans)
        await _merge(storage, audience, large, sampled)
        small = "friendly"  # the same sampled followers, copied: the baseline
        await _seed_audience(storage, small, sampled)
        others = [f"large{i}" for i in range(MERGED_AUTHORS - 1)]
        plain, merged = "plainreader", "mergedreader"
        await _seed_reads(storage, audience, [large, *others], plain, merged)
        async with api_process(azurites) as server, worker(azurites):

            def headers(user: str) -> dict[str, str]:
                return {"Authorization": f"Bearer {signer.mint_bearer(user)}"}

            async def first_page(user: str) -> list[str]:
                url = f"{server.base}/users/{user}/timeline"
                async with server.session.get(url, headers=headers(user)) as response:
                    return [item["post_id"] for item in (await response.json())["items"]]

            visible = await _visibility(server, headers(large), large, sampled, first_page)
            copied = await _visibility(server, headers(small), small, sampled, first_page)
            plain_ms, merged_ms = await _read_latencies(first_page, plain, merged, sizes)
    return {
        "large_author_followers": len(fans),
        "large_post_visible_s": max(visible),
        "large_post_visible_p50_s": statistics.median(visible),
        "copied_post_visible_s": max(copied),
        "plain_read_p50_ms": quantile(plain_ms, 0.5),
        "plain_read_p99_ms": quantile(plain_ms, 0.99),
        f"merged_read_p50_ms_{MERGED_AUTHORS}": quantile(merged_ms, 0.5),
        f"merged_read_p99_ms_{MERGED_AUTHORS}": quantile(merged_ms, 0.99),
    }


async def _seed_audience(storage: Storage, author: str, fans: list[str]) -> None:
    rows = [
        *follower_rows(author, fans),
        {"PartitionKey": author, "RowKey": shard_key(0), "n": len(fans)},
    ]
    await write_rows(storage, SUBJECT_FOLLOWERS, rows, "hybrid: seeding the audience", in_flight=32)


async def _merge(
    storage: Storage, audience: AudienceRepository, author: str, readers: list[str]
) -> None:
    """The author as a finished ``Regrade`` leaves it, for these readers (who follow it: the
    index rows a read checks are written too)."""
    await audience.change_mode(author, AuthorMode(), MERGED, since=now_ticks())
    await bounded((audience.add_merge(reader, author, 20) for reader in readers), 32)
    since = datetime.now(UTC)
    rows = [{"PartitionKey": r, "RowKey": author, "since": since, "active": True} for r in readers]
    await write_rows(storage, SUBJECT_FOLLOWING, rows, "hybrid: following rows", in_flight=32)


async def _seed_reads(
    storage: Storage, audience: AudienceRepository, larges: list[str], plain: str, merged: str
) -> None:
    """Two readers with the same full timeline of copies; one also merges ``larges``, each
    with a page of posts reaching back fifty times further (a large author is one source
    among the hundreds a reader follows)."""
    base = now_ticks() - PAGE * POST_SPACING_TICKS
    own = [Post(new_post_id(base + i * POST_SPACING_TICKS), "friend", TEXT) for i in range(PAGE)]
    copies = [post.to_entity(reader) for reader in (plain, merged) for post in own]
    await write_rows(storage, TIMELINES, copies, "hybrid: seeding timelines")
    spacing = 50 * POST_SPACING_TICKS
    newest = base + PAGE * POST_SPACING_TICKS
    posts = [
        Post(new_post_id(newest - i * spacing - n), author, TEXT).to_entity(author)
        for n, author in enumerate(larges)
        for i in range(PAGE)
    ]
    await write_rows(storage, POSTS, posts, "hybrid: seeding large authors' posts")
    for author in larges:
        await _merge(storage, audience, author, [merged])


async def _visibility(
    server: Any, author_headers: dict[str, str], author: str, sampled: list[str], first_page: Any
) -> list[float]:
    """Seconds from posting until the post is on each sampled follower's first page. Each
    follower has read its timeline once before (as people do), so the API knows its merge
    list; then all of them read again, a few at a time, until the post shows."""
    await bounded((first_page(follower) for follower in sampled), VISIBILITY_READERS)
    started = time.monotonic()
    url = f"{server.base}/users/{author}/posts"
    async with server.session.post(url, json={"text": TEXT}, headers=author_headers) as response:
        post_id = (await response.json())["post_id"]

    readers = asyncio.Semaphore(VISIBILITY_READERS)

    async def seen_by(follower: str) -> float:
        while True:
            async with readers:
                if post_id in await first_page(follower):
                    return time.monotonic() - started
            if time.monotonic() - started > 60:
                raise TimeoutError(f"{follower} never saw the large author's post")

    return list(await asyncio.gather(*(seen_by(follower) for follower in sampled)))


async def _read_latencies(
    first_page: Any, plain: str, merged: str, sizes: Sizes
) -> tuple[list[float], list[float]]:
    """First pages of both readers, one request at a time, alternating, so both meet the
    same machine; the first of each is left out (it warms the merged reader's guess)."""
    plain_ms: list[float] = []
    merged_ms: list[float] = []
    for _ in range(sizes.hybrid_reads + 1):
        for reader, latencies in ((plain, plain_ms), (merged, merged_ms)):
            started = time.perf_counter()
            assert len(await first_page(reader)) == PAGE
            latencies.append(1000 * (time.perf_counter() - started))
    return plain_ms[1:], merged_ms[1:]


async def _regrade(sizes: Sizes) -> dict[str, float]:
    """A real move up of an author with ``regrade_followers`` followers."""
    author = "rising"
    fans = [f"fan{i:07d}" for i in range(sizes.regrade_followers)]
    async with fresh_storage() as (azurites, storage):
        await _seed_audience(storage, author, fans)
        threshold = {"TIMELINE_FANOUT_ON_READ_FOLLOWERS": str(len(fans))}
        async with worker(azurites, **threshold):
            audience = AudienceRepository(storage)
            started = time.monotonic()
            await FanoutQueues(storage).send(Regrade(author=author, merge=True, token="0" * 32))
            while (await audience.mode(author)).state != MERGED:
                if time.monotonic() - started > 900:
                    raise TimeoutError("the regrade did not finish")
                await asyncio.sleep(0.2)
            elapsed = time.monotonic() - started
    return {"regrade_followers": len(fans), "regrade_followers_per_s": len(fans) / elapsed}
