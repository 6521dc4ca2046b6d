"""A ``Followed`` that finds a block ends the pair and goes on as its ``Unfollowed``, rewritten
in place (``FollowChanges._end_blocked``). The rewrite is the only thing that carries that
unfollow: if the lease is lost before it lands (a storage freeze outlasting the lease, a
worker killed, two workers holding the same message after a freeze), the ``Followed`` comes
back unchanged, finds no follow (and, if the block was lifted meanwhile, no block), and must
still lead to the unfollow's purge. Found by ``tests/system/test_chaos.py::test_chaos[3-pause]``:
a list kept a copy of a member who had blocked its owner, with the membership gone; the
unblocked case by the review of the first fix."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

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

UNBLOCKED = pytest.mark.parametrize("unblocked", [False, True], ids=["blocked", "unblocked"])
SYNCED = pytest.mark.parametrize("synced", [True, False], ids=["synced", "died-before-sync"])
"""Whether the follow's (the list add's) request synced the pair's index before it died: one
that did not leaves the index row missing (a first follow) or inactive with no unfollow
recorded (a list add between its two syncs); the pair's end must still record one (found by
the review of cf4df7c)."""


Step = Callable[[], Awaitable[None]]


async def _post_block_redeliver(
    storage: Storage, repos: Repositories, followed: Followed, author: str, block: Step, lift: Step
) -> str:
    """A post of ``author`` copied to ``followed.follower`` while the pair stands; then
    ``block``, the ``Followed``'s first delivery ending the pair (its rewrite then lost),
    ``lift``, and the same ``Followed`` run again. Returns the post's id."""
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(storage, writer, timing=TIMING)
        post = await add_post(repos, author)
        await run_every_pass(processor, PostCreated(author=author, post_id=post.post_id))
        assert post.post_id in await timeline_ids(repos, followed.follower)
        await block()
        outcome = await processor.handle(followed)  # the first delivery that gets through
        assert isinstance(outcome, Continue)
        assert isinstance(outcome.message, Unfollowed)
        assert not await repos.follows.is_following(followed.follower, followed.subject)
        await lift()  # before the Followed comes back (its rewrite lost with the lease)
        await run_every_pass(processor, followed)
    return post.post_id


@UNBLOCKED
@SYNCED
async def test_a_lists_follow_ended_by_a_block_purges_even_if_its_rewrite_was_lost(
    storage: Storage, repos: Repositories, unblocked: bool, synced: bool
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
    if synced:
        await service.lists.add_member(owner, owner, list_id, member)  # answered 204
    else:
        await repos.follows.sync_index(reader, member)  # add_member's first sync
        await repos.follows.add(reader, member, datetime.now(UTC))  # then it died
    followed = Followed(follower=reader, subject=member)

    async def block() -> None:
        await service.relations.block(member, member, owner)  # answered 204

    async def maybe_lift() -> None:
        if unblocked:
            await service.relations.unblock(member, member, owner)

    post_id = await _post_block_redeliver(storage, repos, followed, member, block, maybe_lift)
    assert not await repos.follows.is_following(reader, member)
    assert post_id not in await timeline_ids(repos, reader), (
        "the membership is gone, yet the list keeps the member's copy"
    )


@UNBLOCKED
@SYNCED
async def test_a_follow_ended_by_its_delivery_purges_even_if_its_rewrite_was_lost(
    storage: Storage, repos: Repositories, unblocked: bool, synced: bool
) -> None:
    """The same for a follow whose request died before its re-check
    (``test_a_follow_whose_request_died_is_ended_by_its_delivery``): a post's delivery copied
    while the follow stood; the ``Followed`` ends it, its rewrite is lost, it runs again."""
    follower, subject = await new_users(repos, "follower", "subject")
    relations = RelationsRepository(storage)
    await relations.block(subject, follower)  # its follow check: none
    if synced:
        await add_follow(repos, follower, subject)  # the late write of the dead request
    else:
        await repos.follows.add(follower, subject, datetime.now(UTC))  # died before its sync

    async def nothing() -> None:
        return None

    async def maybe_lift() -> None:
        if unblocked:
            await relations.unblock(subject, follower)

    followed = Followed(follower=follower, subject=subject)
    post_id = await _post_block_redeliver(storage, repos, followed, subject, nothing, maybe_lift)
    assert not await repos.follows.is_following(follower, subject)
    assert post_id not in await timeline_ids(repos, follower), (
        "no follow, yet the follower's home keeps the subject's post"
    )
