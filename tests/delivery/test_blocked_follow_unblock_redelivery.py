"""Review of f4490c3: a ``Followed`` that ended its pair in ``_end_blocked`` and lost its lease
before the rewrite as ``Unfollowed`` landed comes back unchanged. The fix goes on as the
``Unfollowed`` only if it still finds the block; if the block was lifted in between (an
unblock), the re-run finds no follow and no block and ends ``DONE``: the copies delivered
while the follow (or list membership) stood stay, with the follow gone and nothing
left to hide them."""

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


async def test_a_lists_follow_ended_by_a_block_purges_even_if_unblocked_before_the_redelivery(
    storage: Storage, repos: Repositories
) -> None:
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    await service.lists.add_member(owner, owner, list_id, member)
    followed = recorder.sent[-1]
    assert isinstance(followed, Followed)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        post = await add_post(repos, member)
        await run_every_pass(processor, PostCreated(author=member, post_id=post.post_id))
        assert post.post_id in await timeline_ids(repos, reader)
        await service.relations.block(member, member, owner)
        outcome = await processor.handle(followed)  # ends the membership
        assert isinstance(outcome, Continue)
        assert isinstance(outcome.message, Unfollowed)
        # the rewrite is lost with the lease; before the Followed comes back, the member
        # lifts the block
        await service.relations.unblock(member, member, owner)
        await run_every_pass(processor, followed)
    assert not await repos.follows.is_following(reader, member)
    assert post.post_id not in await timeline_ids(repos, reader), (
        "the membership is gone and no block hides it, yet the list keeps the member's copy"
    )


async def test_a_follow_ended_by_its_delivery_purges_even_if_unblocked_before_the_redelivery(
    storage: Storage, repos: Repositories
) -> None:
    follower, subject = await new_users(repos, "follower", "subject")
    relations = RelationsRepository(storage)
    await relations.block(subject, follower)  # the block's follow check: none
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
        await relations.unblock(subject, follower)  # its rewrite lost; then an unblock
        await run_every_pass(processor, followed)
    assert not await repos.follows.is_following(follower, subject)
    assert post.post_id not in await timeline_ids(repos, follower), (
        "no follow and no block, yet the follower's home keeps the subject's post"
    )
