"""Review of cf4df7c: the redelivered ``Followed`` goes on as the ``Unfollowed`` only where the
pair's index row records an unfollow (``left_at``). ``_end_blocked``'s own ``sync_index``
records one only when the index row was *active*: a follow whose request died after its
follow row and before its index sync (``Follows._started``: the very "request died before
its re-check" case ``_end_blocked`` exists for), or a list add that died after its
membership and before its second sync, leaves an index row that is missing or inactive
with no ``left_at``. ``_end_blocked`` then makes (or keeps) it inactive with ``left_at`` 0,
its rewrite is lost, and the ``Followed`` that comes back ends ``DONE``: the copy stays."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.delivery.helpers import Recorder, timeline_ids, unlimited_service
from tests.delivery.hybrid_helpers import new_users
from tests.delivery.test_blocked_follow_redelivery import UNBLOCKED, _post_block_redeliver
from timeline.model.keys import list_reader
from timeline.model.messages import Followed
from timeline.storage.accounts import Storage
from timeline.tables.relations import RelationsRepository
from timeline.tables.repositories import Repositories


@UNBLOCKED
async def test_a_first_follow_whose_request_died_before_its_index_sync_purges_on_redelivery(
    storage: Storage, repos: Repositories, unblocked: bool
) -> None:
    """The follow's request checked the block rows (none), the block wrote them and read no
    follow, the request wrote the follow row, released its ``Followed`` and died before
    ``_started``'s ``sync_index``: no index row for the pair (a first follow). A post is
    copied while the follow stands; the ``Followed`` ends it (block), its rewrite is lost,
    and it comes back."""
    follower, subject = await new_users(repos, "follower", "subject")
    relations = RelationsRepository(storage)
    await relations.block(subject, follower)
    await repos.follows.add(follower, subject, datetime.now(UTC))  # died before sync_index

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


@UNBLOCKED
async def test_a_list_add_that_died_before_its_second_sync_purges_on_redelivery(
    storage: Storage, repos: Repositories, unblocked: bool
) -> None:
    """``Lists.add_member`` syncs the index (inactive row), adds the membership, syncs again:
    the request dies before the second sync (its ``Followed`` shows once hidden). The member
    posts (copied into the list), blocks the owner; the ``Followed`` ends the membership, its
    rewrite is lost, it comes back."""
    owner, member = await new_users(repos, "owner", "member")
    recorder = Recorder(storage, forward=False)
    service = unlimited_service(storage, recorder)
    list_id = (await service.lists.create(owner, owner, "l", False))["list_id"]
    reader = list_reader(owner, list_id)
    await repos.follows.sync_index(reader, member)  # add_member's first sync
    await repos.follows.add(reader, member, datetime.now(UTC))  # then died
    followed = Followed(follower=reader, subject=member)

    async def block() -> None:
        await service.relations.block(member, member, owner)

    async def maybe_lift() -> None:
        if unblocked:
            await service.relations.unblock(member, member, owner)

    post_id = await _post_block_redeliver(storage, repos, followed, member, block, maybe_lift)
    assert not await repos.follows.is_following(reader, member)
    assert post_id not in await timeline_ids(repos, reader), (
        "the membership is gone, yet the list keeps the member's copy"
    )
