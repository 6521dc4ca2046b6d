"""Where reposts and replies meet blocks, mutes, merged (hybrid) authors and the rows they
leave: forced on real storage."""

from __future__ import annotations

import pytest

from tests.delivery.helpers import Recorder, add_follow, add_posts, run_every_pass
from tests.delivery.helpers import unlimited_service as _unlimited
from tests.delivery.hybrid_helpers import HYBRID
from tests.delivery.social.helpers import people, posts_keys
from tests.helpers import put_copies
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import PermissionDeniedError
from timeline.metrics import STORAGE_REQUESTS
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostDeleted, Reposted, Unreposted
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, chunked, submit_batch
from timeline.storage.names import RELATIONS, TIMELINES
from timeline.tables.ratelimits import RateLimits
from timeline.tables.relations import RelationsRepository
from timeline.tables.repositories import Repositories
from timeline.tables.reposts import REPLIES_OF, REPOST, REPOSTS_OF


def _service(storage: Storage) -> TimelineService:
    return _unlimited(storage, home=HomeTimeline(storage, max_merged=HYBRID.max_merged))


async def _entries(service: TimelineService, reader: str, limit: int) -> list[list[dict]]:  # type: ignore[type-arg]
    """Every page of the reader's home timeline, as the API serves them."""
    pages = []
    continuation: str | None = None
    while True:
        page = await service.timelines.home(reader, reader, limit, continuation)
        pages.append(page.items)
        continuation = page.continuation
        if continuation is None:
            return pages


async def test_a_repost_of_a_merged_authors_post_shows(
    storage: Storage, repos: Repositories
) -> None:
    """The reader merges a large author at read time and follows a reposter: the repost's
    entry (``author`` the large author, ``reposted_by`` the reposter) is no copy of the
    large author's posts, which come from ``posts``: it must not be dropped with them."""
    large, reposter, reader = await people(repos, "large", "reposter", "reader")
    await add_follow(repos, reader, large)
    await add_follow(repos, reader, reposter)
    assert await repos.audience.add_merge(reader, large, HYBRID.max_merged)
    [post] = await add_posts(repos, large, 1)
    service = _service(storage)
    item = await service.reposts.repost(reposter, reposter, large, post.post_id)
    message = Reposted(
        reposter=reposter, author=large, post_id=post.post_id, repost_id=item["repost_id"]
    )
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await run_every_pass(FanoutProcessor.on(storage, writer), message)
    pages = await _entries(service, reader, 10)
    newest = pages[0][0]
    assert (newest["post_id"], newest.get("reposted_by")) == (post.post_id, reposter)


async def test_a_refilled_page_shows_a_post_once(storage: Storage, repos: Repositories) -> None:
    """A page thinned by a mute reads on in a second round; that round's original of a post
    the first round showed as a repost must not show it a second time on the same page."""
    reader, friend, reposter, muted = await people(repos, "reader", "friend", "rp", "muted")
    base = now_ticks()
    original = Post(new_post_id(base - 100_000_000), friend, "x")
    repost = Post(new_post_id(base), friend, "x", reposted_by=reposter, original=original.post_id)
    noise = [Post(new_post_id(base - (i + 1) * 1000), muted, "m") for i in range(10)]
    await put_copies(storage, reader, [repost, *noise, original])
    service = _service(storage)
    await service.relations.mute(reader, reader, muted, None, True)
    pages = await _entries(service, reader, 3)
    first = pages[0]
    shown = [e.get("original") or e["post_id"] for e in first]
    assert len(shown) == len(set(shown)), first


async def test_a_blocked_user_cannot_repost_or_reply_to_the_blocker(
    storage: Storage, repos: Repositories
) -> None:
    blocker, blocked = await people(repos, "blocker", "blocked")
    [post] = await add_posts(repos, blocker, 1)
    service = _service(storage)
    await service.relations.block(blocker, blocker, blocked)
    with pytest.raises(PermissionDeniedError) as refused:
        await service.reposts.repost(blocked, blocked, blocker, post.post_id)
    assert refused.value.code == "blocked"
    with pytest.raises(PermissionDeniedError) as refused:
        await service.posts.create(blocked, blocked, "re", reply_to=(blocker, post.post_id))
    assert refused.value.code == "blocked"
    [own] = await add_posts(repos, blocked, 1)  # nor the blocker the blocked user's
    with pytest.raises(PermissionDeniedError):
        await service.reposts.repost(blocker, blocker, blocked, own.post_id)


async def test_a_heavily_blocked_readers_own_mutes_still_apply(
    storage: Storage, repos: Repositories
) -> None:
    """``B-`` (blocked by) sorts before ``b-`` and ``m-``: a reader blocked by more than the
    read loads must still have its own blocks and mutes applied."""
    reader, muted, blocked = await people(repos, "reader", "muted", "blocked")
    relations = RelationsRepository(storage)
    await relations.mute(reader, muted, None, True)
    await relations.block(reader, blocked)
    rows: list[Operation] = [
        ("upsert", {"PartitionKey": reader, "RowKey": f"B-z{i:05d}"}) for i in range(4100)
    ]
    for batch in chunked(rows):
        await submit_batch(storage, RELATIONS, reader, batch)
    hidden, _ = await relations.hidden(reader)
    assert hidden.hides(muted)
    assert hidden.hides(blocked)


async def test_a_deleted_replys_index_row_goes(storage: Storage, repos: Repositories) -> None:
    target, replier = await people(repos, "target", "replier")
    [original] = await add_posts(repos, target, 1)
    sent = Recorder(storage)
    service = TimelineService(
        repos,
        sent,
        TokenSigner(b"test", token_ttl_s=3600),
        page_size=250,
        max_post_chars=280,
        limits=RateLimits.per_minute(storage, posts=0, writes=0, registrations=0),
        home=HomeTimeline(storage, max_merged=20),
    )
    reply = await service.posts.create(replier, replier, "re", reply_to=(target, original.post_id))
    await service.posts.delete(replier, replier, reply.post_id)
    [message] = [m for m in sent.sent if isinstance(m, PostDeleted)]
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await run_every_pass(FanoutProcessor.on(storage, writer), message)
    assert await posts_keys(storage, target, f"{REPLIES_OF}{original.post_id}-") == []


async def test_an_undone_reposts_row_goes(storage: Storage, repos: Repositories) -> None:
    author, reposter = await people(repos, "author", "reposter")
    [post] = await add_posts(repos, author, 1)
    service = _service(storage)
    item = await service.reposts.repost(reposter, reposter, author, post.post_id)
    await service.reposts.unrepost(reposter, reposter, post.post_id)
    message = Unreposted(
        reposter=reposter, author=author, post_id=post.post_id, repost_id=item["repost_id"]
    )
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await run_every_pass(FanoutProcessor.on(storage, writer), message)
    assert await posts_keys(storage, reposter, REPOST) == []


async def test_a_deleted_originals_repost_rows_go(storage: Storage, repos: Repositories) -> None:
    author, reposter = await people(repos, "author", "reposter")
    [post] = await add_posts(repos, author, 1)
    service = _service(storage)
    await service.reposts.repost(reposter, reposter, author, post.post_id)
    await service.posts.delete(author, author, post.post_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        message = PostDeleted(author=author, post_id=post.post_id)
        await run_every_pass(FanoutProcessor.on(storage, writer), message)
    assert await posts_keys(storage, reposter, REPOST) == []
    assert await posts_keys(storage, author, REPOSTS_OF) == []


async def _first_lease_requests(storage: Storage, repos: Repositories, reposters: int) -> float:
    """Storage requests of a delete's first lease, the post reposted by ``reposters`` users
    with three followers each (follower pages of two)."""
    author, *names = await people(repos, "author", *["rp"] * reposters)
    [post] = await add_posts(repos, author, 1)
    service = _service(storage)
    for name in names:
        for follower in await people(repos, "f", "f", "f"):
            await add_follow(repos, follower, name)
        await service.reposts.repost(name, name, author, post.post_id)
    await service.posts.delete(author, author, post.post_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, follower_page_size=2)
        before = STORAGE_REQUESTS._value.get()
        await processor.handle(PostDeleted(author=author, post_id=post.post_id))
        return float(STORAGE_REQUESTS._value.get() - before)


async def test_a_deletes_lease_is_bounded_however_many_reposts(
    storage: Storage, repos: Repositories
) -> None:
    """A lease's work must not grow with the number of reposts (nor their reposters'
    followers): a post reposted by 12 users costs its delete's first lease what one costs,
    give or take a page."""
    one = await _first_lease_requests(storage, repos, 1)
    many = await _first_lease_requests(storage, repos, 12)
    assert many <= 2 * one, (one, many)
