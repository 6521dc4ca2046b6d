"""Reposts: delivery to the reposter's followers, shown once, hidden by ``reposts=false``,
removed by an un-repost and by the original's delete, also when either races the delivery."""

from __future__ import annotations

from tests.delivery.helpers import (
    add_follow,
    add_posts,
    feed_on,
    run_every_pass,
    unlimited_service,
)
from tests.delivery.social.helpers import hold_then_release, people, shown
from tests.helpers import put_copies
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import DONE, Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.repost import repost_copy
from timeline.model.messages import PostCreated, PostDeleted, Reposted, Unreposted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def _repost(storage: Storage, reposter: str, author: str, post_id: str) -> Reposted:
    """What the API does for a repost; the message it queued."""
    item = await unlimited_service(storage).reposts.repost(reposter, reposter, author, post_id)
    return Reposted(reposter=reposter, author=author, post_id=post_id, repost_id=item["repost_id"])


async def test_a_repost_reaches_the_reposters_followers(
    storage: Storage, repos: Repositories
) -> None:
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    message = await _repost(storage, reposter, author, post.post_id)
    again = await _repost(storage, reposter, author, post.post_id)
    assert again.repost_id == message.repost_id  # a second repost is the first
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        assert await FanoutProcessor.on(storage, writer).handle(message) == DONE
        assert await FanoutProcessor.on(storage, writer).handle(message) == DONE  # redelivered
    assert await shown(repos, reader) == [(post.post_id, reposter)]
    [row] = (await repos.timelines.page(reader, 10, None)).items
    assert row.to_json()["reposted_by"] == reposter
    assert row.to_json()["author"] == author


async def test_two_reposts_reach_a_common_follower_once(
    storage: Storage, repos: Repositories
) -> None:
    author, first, second, reader = await people(repos, "author", "rp1", "rp2", "reader")
    await add_follow(repos, reader, first)
    await add_follow(repos, reader, second)
    [post] = await add_posts(repos, author, 1)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await worker.handle(await _repost(storage, first, author, post.post_id))
        await worker.handle(await _repost(storage, second, author, post.post_id))
    assert await shown(repos, reader) == [(post.post_id, first)]


async def test_a_reader_who_has_the_original_gets_no_repost(
    storage: Storage, repos: Repositories
) -> None:
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, author)
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await worker.handle(PostCreated(author=author, post_id=post.post_id))
        await worker.handle(await _repost(storage, reposter, author, post.post_id))
    assert await shown(repos, reader) == [(post.post_id, None)]


async def test_reposts_false_hides_that_accounts_reposts(
    storage: Storage, repos: Repositories
) -> None:
    author, reposter, hider, shower = await people(repos, "author", "rp", "hider", "shower")
    service = unlimited_service(storage)
    await service.follows.follow(hider, hider, reposter, reposts=False)
    await service.follows.follow(shower, shower, reposter)
    [post, later] = await add_posts(repos, author, 2)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await worker.handle(await _repost(storage, reposter, author, post.post_id))
        assert await shown(repos, hider) == []
        assert await shown(repos, shower) == [(post.post_id, reposter)]
        await service.follows.follow(hider, hider, reposter, reposts=True)  # shown again
        await worker.handle(await _repost(storage, reposter, author, later.post_id))
    assert await shown(repos, hider) == [(later.post_id, reposter)]


async def test_an_unrepost_removes_its_copies_and_repeats_harmlessly(
    storage: Storage, repos: Repositories
) -> None:
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    service = unlimited_service(storage)
    message = await _repost(storage, reposter, author, post.post_id)
    undo = Unreposted(
        reposter=reposter, author=author, post_id=post.post_id, repost_id=message.repost_id
    )
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        await worker.handle(message)
        await service.reposts.unrepost(reposter, reposter, post.post_id)
        await service.reposts.unrepost(reposter, reposter, post.post_id)  # idempotent
        await run_every_pass(worker, undo)
        await run_every_pass(worker, undo)  # redone: nothing changes
        assert await worker.handle(message) == DONE  # a late redelivery copies nothing
    assert await shown(repos, reader) == []
    assert await repos.reposts.live_id(reposter, post.post_id) is None


async def test_an_unrepost_beats_an_in_flight_delivery(
    storage: Storage, repos: Repositories
) -> None:
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    message = await _repost(storage, reposter, author, post.post_id)
    undo = Unreposted(
        reposter=reposter, author=author, post_id=post.post_id, repost_id=message.repost_id
    )
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        await hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(message),
            FanoutProcessor.on(storage, prompt).handle(undo),  # its first pass only
        )
    assert await shown(repos, reader) == []


async def test_a_repost_racing_the_originals_delete_leaves_no_copy(
    storage: Storage, repos: Repositories
) -> None:
    """The delivery reads the original alive and holds its writes; the delete's first pass
    runs to the end; the writes land: the delivery's re-check removes them."""
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    message = await _repost(storage, reposter, author, post.post_id)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=3600) as held,
        PartitionWriter(storage, TIMELINES, linger_s=0) as prompt,
    ):
        deleted = await hold_then_release(
            held,
            FanoutProcessor.on(storage, held).handle(message),
            FanoutProcessor.on(storage, prompt).handle(
                PostDeleted(author=author, post_id=post.post_id)
            ),
        )
    assert isinstance(deleted, Continue)
    assert isinstance(deleted.message, PostDeleted)
    assert deleted.message.confirm
    assert await shown(repos, reader) == []
    assert await repos.reposts.live_id(reposter, post.post_id) is None


async def test_the_deletes_second_pass_removes_a_late_repost_copy(
    storage: Storage, repos: Repositories
) -> None:
    """A copy that lands after the delete's first pass (its delivery died before its
    re-check) is removed by the second pass: the first pass leaves the index it reads."""
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    message = await _repost(storage, reposter, author, post.post_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        first = await worker.handle(PostDeleted(author=author, post_id=post.post_id))
        assert isinstance(first, Continue)
        late = repost_copy(post, message)  # what the dead delivery wrote, late
        await put_copies(storage, reader, [late])
        assert await shown(repos, reader) == [(post.post_id, reposter)]
        await run_every_pass(worker, first.message)
    assert await shown(repos, reader) == []
    left = await repos.reposts.reposts_page(author, post.post_id, None, 1000)
    assert left.items == []  # the index went last


async def test_unfollowing_a_reposter_purges_its_reposts_not_the_originals_authors(
    storage: Storage, repos: Repositories
) -> None:
    author, reposter, reader = await people(repos, "author", "reposter", "reader")
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker, feed = FanoutProcessor.on(storage, writer), feed_on(storage, writer)
        await worker.handle(await _repost(storage, reposter, author, post.post_id))
        await feed.purge(reader, author)  # the original's author is not followed: no purge
        assert await shown(repos, reader) == [(post.post_id, reposter)]
        await add_follow(repos, reader, author)
        await feed.purge(reader, author)  # followed: reconciles, and keeps others' reposts
        assert await shown(repos, reader) == [(post.post_id, reposter)]
        await repos.follows.remove(reader, reposter)
        await feed.purge(reader, reposter)
    assert await shown(repos, reader) == []
