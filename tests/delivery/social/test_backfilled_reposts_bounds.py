"""The bounds of a follow's backfill of reposts: the key range of its window and the
window's first tick, a delete whose first pass reaches the subject's repost only after the
backfill's re-check, and a reconcile over more than a page of repost copies."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import eventually
from tests.delivery.helpers import add_follow, add_posts
from tests.delivery.social.helpers import people, shown, stored_repost
from tests.helpers import put_copies
from timeline.delivery import feed
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.repost import repost_copy
from timeline.model.entities import Post
from timeline.model.keys import TICKS_PER_SECOND, new_post_id, now_ticks, post_id_ticks
from timeline.model.messages import PostDeleted, Reposted
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import POSTS, TIMELINES
from timeline.tables.repositories import Repositories
from timeline.tables.reposts import REPOST


async def _repost_rows(storage: Storage, subject: str, rows: list[tuple[Post, str]]) -> None:
    """The subject's live repost rows ``(original, repost id)``, written straight."""
    entities = [
        {
            "PartitionKey": subject,
            "RowKey": f"{REPOST}{original.post_id}",
            "author": original.author,
            "repost_id": repost_id,
        }
        for original, repost_id in rows
    ]
    for start in range(0, len(entities), 100):
        batch = entities[start : start + 100]
        await submit_batch(storage, POSTS, subject, [("upsert", row) for row in batch])


async def test_the_window_reads_exactly_the_repost_rows_of_its_posts(
    storage: Storage, repos: Repositories
) -> None:
    """``live_reposts(subject, start)`` reads the rows of originals made at ``start`` ticks
    or later (the first tick included), never the subject's ``~rpof-`` or ``~re-`` rows
    (those have no ``author``: read, they would fail); ``last_post`` is included."""
    author, subject, other = await people(repos, "author", "subject", "other")
    start = now_ticks() - 3600 * TICKS_PER_SECOND
    before, at, after = (Post(new_post_id(start + d), author, "x") for d in (-1, 0, 1))
    [own] = await add_posts(repos, subject, 1)
    await stored_repost(repos, other, subject, own.post_id)  # a ~rpof- row in subject's
    reply = Post(new_post_id(now_ticks()), other, "re", reply_author=subject)
    await repos.reposts.note_reply(subject, own.post_id, reply)  # a ~re- row in subject's
    ids = {p.post_id: new_post_id(now_ticks() + i) for i, p in enumerate((before, at, after))}
    await _repost_rows(storage, subject, [(p, ids[p.post_id]) for p in (before, at, after)])
    got = await repos.reposts.live_reposts(subject, start)
    assert [r[2] for r in got] == [at.post_id, after.post_id], got
    only = await repos.reposts.live_reposts(subject, post_id_ticks(at.post_id), at.post_id)
    assert [r[2] for r in only] == [at.post_id], only
    every = await repos.reposts.live_reposts(subject)
    assert [r[2] for r in every] == [before.post_id, at.post_id, after.post_id], every


async def test_a_repost_of_a_post_made_at_the_windows_first_tick_is_backfilled_and_kept(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first read and the re-check share one window start: a repost whose original was
    made exactly then is copied and kept by the re-check."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    now = now_ticks()
    monkeypatch.setattr(feed, "now_ticks", lambda: now)
    edge = Post(new_post_id(now - feed.REPOST_BACKFILL_S * TICKS_PER_SECOND), author, "edge")
    older = Post(new_post_id(now - feed.REPOST_BACKFILL_S * TICKS_PER_SECOND - 1), author, "o")
    for post in (edge, older):
        await repos.posts.add(post)
        await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await Feed(Context(repos, writer)).copy_newest(reader, subject, reposts=True)
    assert await shown(repos, reader) == [(edge.post_id, subject)]


async def test_a_delete_whose_first_pass_voids_the_repost_after_the_recheck_leaves_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    """The original has more reposts than a step handles (10), the subject's filed last:
    the backfill's re-check runs between the delete's steps and finds the subject's repost
    still live (kept); the first pass's next step voids it and unpushes it from the
    subject's followers, the reader included, before the second pass."""
    author, reader = await people(repos, "author", "reader")
    others = await people(repos, *(["a-reposter"] * 10))
    [subject] = await people(repos, "z-subject")  # its index row sorts after the others'
    [post] = await add_posts(repos, author, 1)
    for other in others:
        await stored_repost(repos, other, author, post.post_id)
    await stored_repost(repos, subject, author, post.post_id)
    await add_follow(repos, reader, subject)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        worker = FanoutProcessor.on(storage, prompt)
        task = asyncio.ensure_future(
            Feed(Context(repos, held)).copy_newest(reader, subject, reposts=True)
        )

        async def buffered() -> bool:
            return held.buffered > 0

        await eventually(buffered, timeout_s=10, what="the backfill's writes")
        outcome = await worker.handle(PostDeleted(author=author, post_id=post.post_id))
        assert isinstance(outcome, Continue), outcome
        assert outcome.delay_s == 0, outcome
        assert await repos.reposts.live_id(subject, post.post_id) is not None  # not yet
        while not task.done():
            await held.flush()
            await asyncio.sleep(0.01)
        await task
        assert await shown(repos, reader) == [(post.post_id, subject)]  # the re-check kept it
        while isinstance(outcome, Continue) and outcome.delay_s == 0:
            outcome = await worker.handle(outcome.message)
        assert isinstance(outcome, Continue), outcome  # the second pass, not run
        assert await shown(repos, reader) == []


async def test_a_reconcile_over_more_than_a_page_keeps_every_live_repost_copy(
    storage: Storage, repos: Repositories
) -> None:
    """1,010 copies of the subject's live reposts whose originals run the other way than
    the reposts (each page of 1,000 copies spans its own range of originals) and one copy
    of an undone repost: a reconcile removes only the undone one."""
    author, subject, reader = await people(repos, "author", "subject", "reader")
    count, base = 1010, now_ticks() - 3600 * TICKS_PER_SECOND
    originals = [Post(new_post_id(base + 10 * i), author, f"#{i}") for i in range(count + 1)]
    later = now_ticks()
    repost_ids = [new_post_id(later - 10 * i) for i in range(count + 1)]
    await _repost_rows(storage, subject, list(zip(originals, repost_ids, strict=True)))
    copies = [
        repost_copy(o, Reposted(reposter=subject, author=author, post_id=o.post_id, repost_id=r))
        for o, r in zip(originals, repost_ids, strict=True)
    ]
    await put_copies(storage, reader, copies)
    undone = originals[count // 2]
    row = await repos.reposts.truth(subject, undone.post_id)
    assert row is not None
    await repos.reposts.remove(subject, undone.post_id, str(row["repost_id"]))
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await Feed(Context(repos, writer)).reconcile(reader, subject)
    left: set[str] = set()
    pages = 0
    async for rows in repos.timelines.rows_by_author(reader, subject, reposts=True):
        left.update(r.original for r in rows)
        pages += 1
    assert pages > 1, pages
    assert left == {o.post_id for o in originals} - {undone.post_id}
