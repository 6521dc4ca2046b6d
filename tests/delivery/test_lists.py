"""Lists on real storage, each message handled by the test: a member's post reaches the list
(a reply only when its target is a member too), a followers-only post shows there only while
the owner follows its author, a merged large author's posts come at read time, and a deleted
list leaves nothing behind, whatever add raced its deletion."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.delivery.helpers import Recorder, run_every_pass, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import HYBRID, TIMING, add_post, new_users
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue, Done
from timeline.delivery.processor import FanoutProcessor
from timeline.model.entities import FOLLOWERS, Post
from timeline.model.keys import list_reader, new_post_id, now_ticks
from timeline.model.messages import Followed, ListDeleted, PostCreated
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.follows import PairHistory
from timeline.tables.repositories import Repositories
from timeline.tables.rows import partition_page


def _service(storage: Storage, recorder: Recorder) -> TimelineService:
    home = HomeTimeline(storage, max_merged=HYBRID.max_merged)
    return unlimited_service(storage, recorder, home=home)


async def _list_ids(service: TimelineService, owner: str, list_id: str) -> list[str]:
    page = await service.lists.timeline(owner, owner, list_id, 250, None)
    return [item["post_id"] for item in page.items]


async def _deliver(processor: FanoutProcessor, post: Post) -> None:
    await run_every_pass(processor, PostCreated(author=post.author, post_id=post.post_id))


async def test_a_reply_reaches_a_list_only_when_its_target_is_a_member(
    storage: Storage, repos: Repositories
) -> None:
    owner, member, other, outsider = await new_users(repos, "owner", "member", "other", "out")
    recorder = Recorder(storage, forward=False)
    service = _service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    for user in (member, other):
        await service.lists.add_member(owner, owner, list_id, user)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        to_member = Post(new_post_id(now_ticks()), member, "hi", reply_author=other)
        to_outsider = Post(new_post_id(now_ticks()), member, "yo", reply_author=outsider)
        for post in (to_member, to_outsider):
            await repos.posts.add(post)
            await _deliver(processor, post)
    assert await _list_ids(service, owner, list_id) == [to_member.post_id]


async def test_a_followers_only_post_shows_in_a_list_only_while_the_owner_follows(
    storage: Storage, repos: Repositories
) -> None:
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = _service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    await service.lists.add_member(owner, owner, list_id, member)
    private = Post(new_post_id(now_ticks()), member, "followers only", visibility=FOLLOWERS)
    await repos.posts.add(private)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await _deliver(FanoutProcessor.on(storage, writer, timing=TIMING), private)
    assert await _list_ids(service, owner, list_id) == []  # not a follower
    await service.follows.follow(owner, owner, member)
    assert await _list_ids(service, owner, list_id) == [private.post_id]
    await service.follows.unfollow(owner, owner, member)
    assert await _list_ids(service, owner, list_id) == []


async def test_a_merged_large_members_posts_come_at_read_time(
    storage: Storage, repos: Repositories
) -> None:
    owner, large = await new_users(repos, "owner", "large")
    recorder = Recorder(storage, forward=False)
    service = _service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    await service.lists.add_member(owner, owner, list_id, large)
    assert await repos.audience.add_merge(reader, large, HYBRID.max_merged)
    posts = [await add_post(repos, large) for _ in range(3)]
    assert await _list_ids(service, owner, list_id) == [p.post_id for p in reversed(posts)]
    assert await timeline_ids(repos, reader) == []  # nothing copied
    await service.lists.remove_member(owner, owner, list_id, large)
    assert await _list_ids(service, owner, list_id) == []  # no longer a member: at once


async def test_an_add_racing_the_deletion_is_ended_by_its_second_pass(
    storage: Storage, repos: Repositories
) -> None:
    """The add read the list before it was deleted, and its rows landed after the first pass
    walked the members: the second pass ends it and drops what its copies left."""
    owner, member, late = await new_users(repos, "owner", "member", "late")
    recorder = Recorder(storage, forward=False)
    service = _service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    await service.lists.add_member(owner, owner, list_id, member)
    posts = [await add_post(repos, member), await add_post(repos, late)]
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        await run_every_pass(processor, recorder.sent[-1])  # the member's backfill
        assert await timeline_ids(repos, reader) == [posts[0].post_id]
        await service.lists.delete(owner, owner, list_id)
        deleted = recorder.sent[-1]
        assert isinstance(deleted, ListDeleted)
        first = await processor.handle(deleted)
        assert isinstance(first, Continue)
        assert first.delay_s == TIMING.sweep_delay_s
        assert await timeline_ids(repos, reader) == []
        await repos.follows.sync_index(reader, late)  # the racing add's rows, landing late
        await repos.follows.add(reader, late, datetime.now(UTC))
        await _deliver(processor, posts[1])  # its member's post reaches the list meanwhile
        assert await timeline_ids(repos, reader) == [posts[1].post_id]
        assert isinstance(await processor.handle(first.message), Done)
    assert not await repos.follows.is_following(reader, late)
    assert not await repos.follows.is_following(reader, member)
    assert await timeline_ids(repos, reader) == []
    page = await partition_page(
        storage, TIMELINES, reader, select=["RowKey"], limit=10, continuation=None, until="~~"
    )
    assert page.items == []  # no head or merge rows either
    assert (await repos.follows.following_page(reader, 10, None)).items == []


async def test_a_follow_message_of_a_deleted_list_ends_its_pair(
    storage: Storage, repos: Repositories
) -> None:
    """A membership written after the deletion's passes (an add that stalled) is ended by
    its own ``Followed``: the list is gone, so the message ends that pair and drops the
    timeline, now and once more later."""
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = _service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    await add_post(repos, member)
    await service.lists.delete(owner, owner, list_id)
    await repos.follows.sync_index(reader, member)  # the stalled add's rows
    await repos.follows.add(reader, member, datetime.now(UTC))
    await repos.follows.sync_index(reader, member)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        message = Followed(follower=reader, subject=member)
        outcome = await processor.handle(message)
        assert isinstance(outcome, Continue)
        assert outcome.message == message.model_copy(update={"confirm": True})
        assert outcome.delay_s == TIMING.sweep_delay_s
        assert isinstance(await processor.handle(outcome.message), Done)
    assert not await repos.follows.is_following(reader, member)
    assert await timeline_ids(repos, reader) == []
    assert await repos.follows.history(reader, member) == PairHistory()  # no index row
