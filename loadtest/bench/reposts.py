"""Reposts and replies: what their rules add to a delivery, on a real worker process.

Five reposters repost one post; their followers overlap by half (so a common follower meets
the post again and the de-duplication skips it). Then a replier with as many followers, of
whom half also follow the author replied to, posts a reply. Measured: the de-duplication's
queries per reader reached (``repost_dedupe_requests_per_delivery``), the share of repost
copies it skipped, the worker's CPU per repost copy written, and the replied-to author's
follower queries per page of a reply's delivery."""

from __future__ import annotations

import asyncio
import time

from loadtest.bench.harness import (
    DELIVERIES,
    TEXT,
    WorkerProcess,
    follower_rows,
    fresh_storage,
    publish,
    worker,
    write_rows,
)
from loadtest.bench.measure import delta
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import FanoutMessage, Reposted, encode
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS
from timeline.storage.queue import FanoutQueues
from timeline.tables.reposts import RepostsRepository

REPOSTERS = 5
DEDUPE = "timeline_repost_dedupe_requests_total"
DEDUPED = "timeline_repost_deduped_total"
REPLY_CHECKS = "timeline_reply_follow_checks_total"
TIMEOUT_S = 300.0


async def reposts(sizes: Sizes) -> dict[str, float]:
    followers = sizes.inactive_followers
    pool = [f"rr{i:05d}" for i in range(followers * (REPOSTERS + 1) // 2)]
    reposters = [f"rp{k}" for k in range(REPOSTERS)]
    fans = {
        r: [pool[(k * followers // 2 + j) % len(pool)] for j in range(followers)]
        for k, r in enumerate(reposters)
    }
    async with fresh_storage() as (azurites, storage):
        rows = [row for r, f in fans.items() for row in follower_rows(r, f)]
        await write_rows(storage, SUBJECT_FOLLOWERS, rows, "reposts: followers")
        original = Post(new_post_id(now_ticks()), "author", TEXT)
        await publish(storage, original)  # the author has no followers: one copy, its own
        async with worker(azurites) as process:
            await _until_done(process, {}, "post", 1)  # the original's own copy, not measured
            readers = sum(len(f) for f in fans.values())
            measured = await _repost_all(storage, process, original, reposters, readers)
            reply = await _reply(storage, process, original, pool, followers)
    return measured | reply


async def _repost_all(
    storage: Storage, process: WorkerProcess, original: Post, reposters: list[str], readers: int
) -> dict[str, float]:
    repository = RepostsRepository(storage)
    messages: list[FanoutMessage] = []
    for reposter in reposters:
        repost_id = new_post_id(now_ticks())
        await repository.note_index(original.author, original.post_id, reposter, repost_id)
        await repository.create(reposter, original.author, original.post_id, repost_id)
        messages.append(
            Reposted(
                reposter=reposter,
                author=original.author,
                post_id=original.post_id,
                repost_id=repost_id,
            )
        )
    before, cpu_before = await process.metrics(), process.cpu_s()
    for done, message in enumerate(messages, 1):  # one after another, as the dedupe sees them
        await FanoutQueues(storage).shard_for(message).send_raw(encode(message))
        await _until_done(process, before, "repost", done)
    after = await process.metrics()
    cpu = process.cpu_s() - cpu_before
    written = delta(before, after, DELIVERIES)
    return {
        "repost_dedupe_requests_per_delivery": delta(before, after, DEDUPE) / readers,
        "repost_deduped_share": delta(before, after, DEDUPED) / readers,
        "repost_worker_cpu_ms_per_copy": 1000 * cpu / max(1.0, written),
    }


async def _until_done(
    process: WorkerProcess, before: dict[str, float], kind: str, count: int
) -> None:
    """Wait until the worker has completed ``count`` messages of ``kind`` since ``before``
    (every message here is one page: each reader is reached by then)."""
    name = f"fanout_messages_total{{outcome=done,type={kind}}}"
    deadline = time.monotonic() + TIMEOUT_S
    while (seen := delta(before, await process.metrics(), name)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reposts: {seen} of {count} {kind} messages done")
        await asyncio.sleep(0.1)


async def _reply(
    storage: Storage, process: WorkerProcess, original: Post, pool: list[str], followers: int
) -> dict[str, float]:
    """A reply to ``original`` by a replier whose followers half follow its author."""
    replier = "replier"
    fans = pool[:followers]
    rows = follower_rows(replier, fans) + follower_rows(original.author, fans[: followers // 2])
    await write_rows(storage, SUBJECT_FOLLOWERS, rows, "reposts: reply followers")
    reply = Post(
        new_post_id(now_ticks()),
        replier,
        TEXT,
        reply_author=original.author,
        reply_post=original.post_id,
    )
    before = await process.metrics()
    await publish(storage, reply)
    await _until_done(process, before, "post", 1)
    after = await process.metrics()
    return {
        "reply_follow_checks_per_page": delta(before, after, REPLY_CHECKS),
        "reply_copies_share": (delta(before, after, DELIVERIES) - 1) / followers,
    }
