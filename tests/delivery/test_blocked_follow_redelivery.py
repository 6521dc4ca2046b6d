"""A ``Followed`` that finds a block ends the pair and goes on as its ``Unfollowed``, rewritten
in place (``FollowChanges._end_blocked``). The rewrite is the only thing that carries that
unfollow: if the lease is lost before it lands (a storage freeze outlasting the lease, a
worker killed, two workers holding the same message after a freeze), the ``Followed`` comes
back unchanged, finds no follow, and must still lead to the unfollow's purge. Found by
``tests/system/test_chaos.py::test_chaos[3-pause]``: a list kept a copy of a member who had
blocked its owner, with the membership gone."""

from __future__ import annotations

from tests.delivery.helpers import (
    Recorder,
    add_follow,
    run_every_pass,
    timeline_ids,
    unlimited_service,
)
from tests.delivery.hybrid_helpers import TIMING, add_post, new_users
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.model.keys import list_reader
from timeline.model.messages import Followed, PostCreated, Unfollowed
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.relations import RelationsRepository
from timeline.tables.repositories import Repositories


async def test_a_lists_follow_ended_by_a_block_purges_even_if_its_rewrite_was_lost(
    storage: Storage, repos: Repositories
) -> None:
    """The chaos run's interleaving: the owner adds the member (its ``Followed`` held up by
    a freeze and a killed worker), the member posts (the copy lands in the list: the member
    is one), the member blocks the owner; the ``Followed`` then runs, sees the block, removes
    the membership and asks for its rewrite as an ``Unfollowed``; that rewrite is lost with
    the lease, and the ``Followed`` runs again. The list must not keep the member's copies
    once the membership is gone (the end-state check reads it without any filter)."""
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    await service.lists.add_member(owner, owner, list_id, member)  # answered 204
    followed = recorder.sent[-1]
    assert isinstance(followed, Followed)
    assert followed.follower == reader
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        post = await add_post(repos, member)
        await run_every_pass(processor, PostCreated(author=member, post_id=post.post_id))
        assert post.post_id in await timeline_ids(repos, reader)  # a member's post: copied
        await service.relations.block(member, member, owner)  # answered 204
        outcome = await processor.handle(followed)  # the first delivery that gets through
        assert isinstance(outcome, Continue)
        assert isinstance(outcome.message, Unfollowed)
        assert not await repos.follows.is_following(reader, member)
        # the lease is lost before the rewrite lands: the same Followed comes back
        await run_every_pass(processor, followed)
    assert not await repos.follows.is_following(reader, member)
    assert post.post_id not in await timeline_ids(repos, reader), (
        "the membership is gone, yet the list keeps the member's copy"
    )


async def test_a_follow_ended_by_its_delivery_purges_even_if_its_rewrite_was_lost(
    storage: Storage, repos: Repositories
) -> None:
    """The same for a follow whose request died before its re-check
    (``test_a_follow_whose_request_died_is_ended_by_its_delivery``): a post's delivery copied
    while the follow stood; the ``Followed`` ends it, its rewrite is lost, it runs again."""
    follower, subject = await new_users(repos, "follower", "subject")
    await RelationsRepository(storage).block(subject, follower)  # its follow check: none
    await add_follow(repos, follower, subject)  # the late write of the dead request
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        post = await add_post(repos, subject)
        await run_every_pass(processor, PostCreated(author=subject, post_id=post.post_id))
        assert post.post_id in await timeline_ids(repos, follower)
        followed = Followed(follower=follower, subject=subject)
        outcome = await processor.handle(followed)
        assert isinstance(outcome, Continue)
        assert isinstance(outcome.message, Unfollowed)
        await run_every_pass(processor, followed)  # its rewrite lost: it comes back
    assert not await repos.follows.is_following(follower, subject)
    assert post.post_id not in await timeline_ids(repos, follower)
