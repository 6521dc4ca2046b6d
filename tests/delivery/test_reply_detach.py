"""Replies to a deleted account (``timeline.delivery.replies``): the reply and every copy of
it (its readers', a list's, its reposts' readers') stay, answering nobody, and no row keeps
the deleted id; a copy written from a read made before the mark is marked by the second
pass; a removal that read a copy before it was marked reads it again and still removes it;
a detached reply reaches no new reader but its author."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.delivery.helpers import timeline_ids
from tests.delivery.hybrid_helpers import TIMING, new_users
from tests.delivery.test_account_deletion import World, rows_holding, world
from tests.delivery.test_account_deletion_races import only_tombstone
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import Continue
from timeline.model.entities import DETACHED, Post, row_json
from timeline.model.keys import list_reader, new_post_id, now_ticks, post_row_key
from timeline.model.messages import PostCreated, ReplyDetached
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def copy_of(repos: Repositories, owner: str, post_id: str) -> Post | None:
    """The owner's copy keyed by ``post_id`` (a post's, or a repost's id)."""
    page = await repos.timelines.page(owner, 1000, None)
    return next((post for post in page.items if post.post_id == post_id), None)


async def thread(w: World) -> tuple[list[str], str, str]:
    """``gone`` posts; ``replier`` answers it; ``reader`` follows both and gets the reply;
    ``reposter`` reposts the reply to ``fan``; a list of ``owner`` holds both authors.
    Returns the users, the reply's id and the repost's id."""
    users = await new_users(w.repos, "gone", "replier", "reader", "reposter", "fan", "owner")
    gone, replier, reader, reposter, fan, owner = users
    s = w.service
    for followee in (gone, replier):
        await s.follows.follow(reader, reader, followee)
    await s.follows.follow(fan, fan, reposter)
    listed = (await s.lists.create(owner, owner, "both", False))["list_id"]
    for member in (gone, replier):
        await s.lists.add_member(owner, owner, listed, member)
    original = await s.posts.create(gone, gone, "the original")
    await w.drain()
    reply = await s.posts.create(replier, replier, "an answer", reply_to=(gone, original.post_id))
    await w.drain()
    repost = await s.reposts.repost(reposter, reposter, replier, reply.post_id)
    await w.drain()
    return [*users, list_reader(owner, listed)], reply.post_id, str(repost["repost_id"])


async def test_the_reply_and_every_copy_stay_answering_nobody(own: Storage) -> None:
    async with world(own) as w:
        (gone, replier, reader, _, fan, _, listed), reply, repost = await thread(w)
        holders = {replier: reply, reader: reply, listed: reply, fan: repost}
        for owner, key in holders.items():
            copy = await copy_of(w.repos, owner, key)
            assert copy is not None, owner
            assert copy.reply_author == gone, owner

        await w.service.accounts.delete(gone, gone)
        await w.drain()

        assert await rows_holding(own, gone) == only_tombstone(gone)
        source = await w.repos.posts.get(replier, reply)
        assert source is not None
        assert source.reply_author == DETACHED
        for owner, key in holders.items():
            copy = await copy_of(w.repos, owner, key)
            assert copy is not None, owner
            assert copy.reply_author == DETACHED, owner
            assert row_json(copy.to_entity(owner))["reply_to"]["author"] is None


async def test_a_copy_written_from_an_older_read_is_marked_by_the_second_pass(
    own: Storage,
) -> None:
    async with world(own) as w:
        (gone, replier, reader, *_), reply, _ = await thread(w)
        stale = await w.repos.posts.get(replier, reply)  # read before the mark
        assert stale is not None
        await w.service.accounts.delete(gone, gone)
        source = await w.repos.posts.get(replier, reply)
        assert source is not None
        assert source.reply_post is not None
        detach = ReplyDetached(
            author=replier, post_id=reply, target=gone, target_post=source.reply_post
        )
        outcome = await w.processor.handle(detach)  # the first pass, to the end
        while isinstance(outcome, Continue) and not outcome.message.confirm:  # type: ignore[union-attr]
            outcome = await w.processor.handle(outcome.message)
        assert isinstance(outcome, Continue)
        await submit_batch(own, TIMELINES, reader, [("upsert", stale.to_entity(reader))])
        while isinstance(outcome, Continue):  # the second pass
            outcome = await w.processor.handle(outcome.message)
        await w.drain()  # the deletion (the first pass began: its sweeps send it no more)
        copy = await copy_of(w.repos, reader, reply)
        assert copy is not None
        assert copy.reply_author == DETACHED
        assert await rows_holding(own, gone) == only_tombstone(gone)


def marking_after_the_first_read(
    w: World, owner: str, key: str
) -> Callable[[str, str], Awaitable[bool]]:
    """``is_following`` that marks the owner's copy the first time it is asked: a reply's
    pass that lands between a removal's read of the copy and its conditional delete."""
    real = w.repos.follows.is_following
    marked = False

    async def is_following(follower: str, subject: str) -> bool:
        nonlocal marked
        if not marked:
            marked = True
            await w.repos.timelines.detach_reply([owner], post_row_key(key))
        return await real(follower, subject)

    return is_following


@pytest.mark.parametrize("removal", ["purge", "recheck"])
async def test_a_removal_that_read_a_copy_before_its_mark_still_removes_it(
    own: Storage, monkeypatch: pytest.MonkeyPatch, removal: str
) -> None:
    """An unfollow's purge, or a delivery's re-check, reads the copy's etag, then the
    follow; a mark lands in between: the conditional delete fails, and it decides again."""
    async with world(own) as w:
        (_, replier, reader, *_), reply, _ = await thread(w)
        await w.repos.follows.remove(reader, replier)
        marking = marking_after_the_first_read(w, reader, reply)
        monkeypatch.setattr(w.repos.follows, "is_following", marking)
        async with PartitionWriter(own, TIMELINES, linger_s=0) as writer:
            feed = Feed(Context(w.repos, writer, timing=TIMING))
            if removal == "purge":
                await feed.purge(reader, replier)
            else:
                await feed.unpush_if_unfollowed(reader, replier, post_row_key(reply))
        assert reply not in await timeline_ids(w.repos, reader)


async def test_a_detached_reply_reaches_no_new_reader_but_its_author(own: Storage) -> None:
    async with world(own) as w:
        (gone, replier, *_), reply, _ = await thread(w)
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        (newcomer,) = await new_users(w.repos, "newcomer")
        await w.service.follows.follow(newcomer, newcomer, replier)
        w.recorder.sent.append(PostCreated(author=replier, post_id=reply))  # redelivered
        await w.drain()
        assert reply not in await timeline_ids(w.repos, newcomer)
        assert reply in await timeline_ids(w.repos, replier)


async def test_a_reply_never_stored_leaves_its_index_row_until_a_later_sweep(
    own: Storage,
) -> None:
    """A reply request that died after filing its index row: a pass writes nothing, and
    drops the row only when sent by a sweep after the first (every such request has landed
    by then)."""
    async with world(own) as w:
        replier, gone = await new_users(w.repos, "replier", "gone")
        original = await w.service.posts.create(gone, gone, "the original")
        never = Post(
            new_post_id(now_ticks()),
            replier,
            "never",
            reply_author=gone,
            reply_post=original.post_id,
        )
        await w.repos.reposts.note_reply(gone, original.post_id, never)
        for sweep in (0, 1):
            message = ReplyDetached(
                author=replier,
                post_id=never.post_id,
                target=gone,
                target_post=original.post_id,
                sweep=sweep,
            )
            w.recorder.sent.append(message)
            await w.drain()
            filed = await w.repos.reposts.replies_page(gone, original.post_id, 10, None)
            assert filed.items == ([] if sweep else [(replier, never.post_id)])
        assert (await w.repos.posts.page(replier, 10, None)).items == []
        assert await timeline_ids(w.repos, replier) == []
