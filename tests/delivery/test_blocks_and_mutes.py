"""Blocks and mutes at read time and against follows in flight, forced on real storage:
merged (hybrid) authors, a block racing a follow, reposts, pages thinned by filtering."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.delivery.helpers import add_follow, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import HYBRID, add_post, new_users
from tests.faults import StorageFront
from tests.helpers import put_copies
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import ConflictError, PermissionDeniedError
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.model.messages import Followed
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, chunked, submit_batch
from timeline.storage.names import RELATIONS, SUBJECT_FOLLOWERS, TIMELINES
from timeline.tables.relations import MAX_MUTES, RelationsRepository
from timeline.tables.repositories import Repositories


def _service(storage: Storage) -> TimelineService:
    return unlimited_service(storage, home=HomeTimeline(storage, max_merged=HYBRID.max_merged))


async def _home(service: TimelineService, reader: str, limit: int = 250) -> list[list[str]]:
    """Every page of the reader's home timeline, as post ids."""
    pages: list[list[str]] = []
    continuation: str | None = None
    while True:
        page = await service.timelines.home(reader, reader, limit, continuation)
        pages.append([item["post_id"] for item in page.items])
        continuation = page.continuation
        if continuation is None:
            return pages


def _flat(pages: list[list[str]]) -> list[str]:
    return [post for page in pages for post in page]


async def test_a_merged_author_is_hidden_by_a_mute_and_a_block_at_once(
    storage: Storage, repos: Repositories
) -> None:
    """A large author's posts come from ``posts`` at read time, never from the reader's
    partition: a mute (no unfollow) and a block (before the worker ran) still hide them."""
    author, friend, reader = await new_users(repos, "large", "friend", "reader")
    await add_follow(repos, reader, author)
    await add_follow(repos, reader, friend)
    assert await repos.audience.add_merge(reader, author, HYBRID.max_merged)
    merged = [await add_post(repos, author) for _ in range(3)]
    kept = await add_post(repos, friend)
    await put_copies(storage, reader, [kept])
    service = _service(storage)
    assert set(_flat(await _home(service, reader))) == {kept.post_id, *(p.post_id for p in merged)}
    await service.relations.mute(reader, reader, author, None, True)
    assert _flat(await _home(service, reader)) == [kept.post_id]
    await service.relations.unmute(reader, reader, author)
    assert len(_flat(await _home(service, reader))) == 4
    await service.relations.block(reader, reader, author)  # its purge is queued, not run
    assert _flat(await _home(service, reader)) == [kept.post_id]
    assert not await repos.follows.is_following(reader, author)


async def test_the_blocked_side_stops_seeing_the_blocker_at_once(own: Storage) -> None:
    """On an Azurite of its own: the session's worker would run the block's unfollow and
    purge the copy this test expects to find still there, hidden."""
    storage, repos = own, Repositories.on(own)
    blocker, blocked = await new_users(repos, "blocker", "blocked")
    await add_follow(repos, blocked, blocker)
    post = await add_post(repos, blocker)
    await put_copies(storage, blocked, [post])
    service = _service(storage)
    assert _flat(await _home(service, blocked)) == [post.post_id]
    await service.relations.block(blocker, blocker, blocked)
    assert _flat(await _home(service, blocked)) == []  # the copy is still there, hidden
    assert post.post_id in await timeline_ids(repos, blocked)
    with pytest.raises(PermissionDeniedError) as refused:
        await service.follows.follow(blocked, blocked, blocker)
    assert refused.value.code == "blocked"


async def test_a_block_racing_a_follow_ends_the_follow(
    front: StorageFront, fronted: Storage
) -> None:
    """The follow checked for a block and is about to write its row when the block lands
    and ends follows (finding none): the follow's re-check after its write ends it."""
    repos = Repositories.on(fronted)
    follower, subject = await new_users(repos, "follower", "subject")
    service = _service(fronted)
    front.hold_writes.add(SUBJECT_FOLLOWERS)  # the follow's transaction waits
    following = asyncio.create_task(service.follows.follow(follower, follower, subject))
    await asyncio.wait_for(front.held.wait(), 10)
    front.hold_writes.clear()  # only that one
    await service.relations.block(subject, subject, follower)
    assert not await repos.follows.is_following(follower, subject)  # not landed yet
    front.gate.set()
    with pytest.raises(PermissionDeniedError):
        await following
    assert not await repos.follows.is_following(follower, subject)
    assert (await repos.follows.following_page(follower, 1000, None)).items == []


async def test_a_follow_whose_request_died_is_ended_by_its_delivery(
    storage: Storage, repos: Repositories
) -> None:
    """The block's unfollow read before the follow row landed, and the follow's request
    died before its re-check: the follow's delivery sees the block, ends the follow and
    goes on as its unfollow, so no copy stays."""
    follower, subject = await new_users(repos, "follower", "subject")
    posts = [await add_post(repos, subject) for _ in range(3)]
    await RelationsRepository(storage).block(subject, follower)  # its follow check: none
    await add_follow(repos, follower, subject)  # the late write of the dead request
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer)
        outcome = await processor.handle(Followed(follower=follower, subject=subject))
        assert isinstance(outcome, Continue)
        assert not await repos.follows.is_following(follower, subject)
        await processor.handle(outcome.message)  # the unfollow's first pass
    assert not {post.post_id for post in posts} & set(await timeline_ids(repos, follower))


async def _write_repost(storage: Storage, reader: str, original: Post, reposter: str) -> str:
    """A repost entry as the reposts work writes it: the original's author and text, and
    ``reposted_by``."""
    row = {
        "PartitionKey": reader,
        "RowKey": post_row_key(original.post_id),
        "author": original.author,
        "text": original.text,
        "reposted_by": reposter,
    }
    await storage.table(TIMELINES, reader).upsert_entity(row)
    return original.post_id


async def test_a_mute_without_reposts_keeps_their_reposts(
    storage: Storage, repos: Repositories
) -> None:
    reader, muted, author = await new_users(repos, "reader", "muted", "author")
    own = await add_post(repos, muted)
    await put_copies(storage, reader, [own])
    reposted = await _write_repost(storage, reader, await add_post(repos, author), muted)
    service = _service(storage)
    await service.relations.mute(reader, reader, muted, None, False)
    assert _flat(await _home(service, reader)) == [reposted]
    await service.relations.mute(reader, reader, muted, None, True)  # reposts muted too
    assert _flat(await _home(service, reader)) == []
    await service.relations.unmute(reader, reader, muted)
    await service.relations.block(reader, reader, author)  # a block hides the original
    assert _flat(await _home(service, reader)) == [own.post_id]


async def test_thinned_pages_are_full_and_continue_right(
    storage: Storage, repos: Repositories
) -> None:
    """Muted entries between the visible ones: every page but the last is full, and the
    pages together hold each visible entry once, in order."""
    reader, muted, friend = await new_users(repos, "reader", "muted", "friend")
    base, entries = now_ticks(), []
    for i in range(40):
        author = muted if i % 4 else friend  # three muted in four
        entries.append(Post(new_post_id(base - i * 1000), author, "x"))
    await put_copies(storage, reader, entries)
    service = _service(storage)
    await service.relations.mute(reader, reader, muted, None, True)
    visible = [post.post_id for post in entries if post.author == friend]
    pages = await _home(service, reader, limit=3)
    assert _flat(pages) == visible
    assert [len(page) for page in pages[:-1]] == [3] * (len(pages) - 1)


async def test_mutes_expire_by_time_and_are_capped(storage: Storage, repos: Repositories) -> None:
    reader, muted = await new_users(repos, "reader", "muted")
    relations = RelationsRepository(storage)
    ends = time.time() + 60
    await relations.mute(reader, muted, ends, True)
    hidden, queries = await relations.hidden(reader, now=ends - 1)
    assert hidden.hides(muted)
    assert queries == 1
    hidden, _ = await relations.hidden(reader, now=ends)
    assert not hidden.hides(muted)
    assert await relations.count(reader, "m-", MAX_MUTES) == 1


async def test_thinned_pages_with_a_merged_author(storage: Storage, repos: Repositories) -> None:
    """The same with a large author merged at read time between the muted copies: each
    visible entry once, newest first, full pages but the last."""
    reader, muted, large = await new_users(repos, "reader", "muted", "large")
    await add_follow(repos, reader, large)
    assert await repos.audience.add_merge(reader, large, HYBRID.max_merged)
    base = now_ticks()
    copies = [Post(new_post_id(base - i * 1000), muted, "x") for i in range(30)]
    await put_copies(storage, reader, copies)
    merged = [await add_post(repos, large, base - i * 3000 - 500) for i in range(8)]
    service = _service(storage)
    await service.relations.mute(reader, reader, muted, None, True)
    for limit in (1, 3, 250):
        pages = await _home(service, reader, limit=limit)
        assert _flat(pages) == [post.post_id for post in merged], limit
        assert all(len(page) == limit for page in pages[:-1]), (limit, pages)


async def test_mutes_past_the_cap_are_refused_and_existing_ones_may_change(
    storage: Storage, repos: Repositories
) -> None:
    reader, one, more = await new_users(repos, "reader", "one", "more")
    rows: list[Operation] = [
        ("upsert", {"PartitionKey": reader, "RowKey": f"m-{i:04d}"}) for i in range(MAX_MUTES - 1)
    ]
    for batch in chunked(rows):
        await submit_batch(storage, RELATIONS, reader, batch)
    service = _service(storage)
    await service.relations.mute(reader, reader, one, None, True)  # the 1,000th
    with pytest.raises(ConflictError) as refused:
        await service.relations.mute(reader, reader, more, None, True)
    assert refused.value.code == "too_many_mutes"
    await service.relations.mute(reader, reader, one, None, False)  # a change is no new mute
