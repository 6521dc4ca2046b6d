"""Account deletion against the interleavings a review found (each failed before its fix):
ex-follows, ex-memberships and requests that died after their index row leave nothing
naming the account; the sweep outlasts every write the API can still land, and a write
landing before it is undone. And what held from the start: redeliveries after the drop, a
merged author with overflow readers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fanout_worker.sweeper import Sweeper
from tests.conftest import make_settings
from tests.delivery.helpers import Recorder, unlimited_service
from tests.delivery.hybrid_helpers import HYBRID, TIMING, home_pages, new_users, regrade
from tests.delivery.test_account_deletion import rows_holding, world
from tests.tables.test_mute_and_filter_lifetime import LATER
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.outcomes import Continue
from timeline.delivery.processor import FanoutProcessor
from timeline.model.entities import Post
from timeline.model.keys import list_reader, new_post_id, now_ticks
from timeline.model.messages import (
    AccountDeleted,
    FanoutMessage,
    PostCreated,
    Reposted,
    Unfollowed,
)
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables import follows as follows_module
from timeline.tables.audience import MERGED
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite


class Died(Exception):
    """The process died here."""


async def run_all(processor: FanoutProcessor, recorder: Recorder) -> None:
    """Every message sent so far and every one it leads to, to the end (delays skipped)."""
    work = list(recorder.sent)
    recorder.sent.clear()
    while work:
        outcome = await processor.handle(work.pop(0))
        if isinstance(outcome, Continue):
            work.append(outcome.message)
        work.extend(recorder.sent)
        recorder.sent.clear()


def only_tombstone(user: str) -> list[tuple[str, str, str]]:
    return [("users", user, IDENTITY_ROW_KEY)]


async def test_an_ex_followers_index_row_goes(own: Storage) -> None:
    """F followed U and unfollowed it before U's deletion: F's ``subjectFollowing`` keeps an
    inactive index row named U (an unfollow never deletes it), which the deletion never
    finds (it reads U's followers, and F is no longer one)."""
    async with world(own) as w:
        gone, ex = await new_users(w.repos, "gone", "ex")
        await w.service.follows.follow(ex, ex, gone)
        await w.drain()
        await w.service.follows.unfollow(ex, ex, gone)
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_an_ex_blockers_index_row_goes(own: Storage) -> None:
    """The same through a block: B followed U, then blocked it (the block ends the follow)."""
    async with world(own) as w:
        gone, blocker = await new_users(w.repos, "gone", "blocker")
        await w.service.follows.follow(blocker, blocker, gone)
        await w.drain()
        await w.service.relations.block(blocker, blocker, gone)
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_an_ex_members_list_index_row_goes(own: Storage) -> None:
    """O's list had U as a member, removed before U's deletion: the list's index keeps U."""
    async with world(own) as w:
        gone, owner = await new_users(w.repos, "gone", "owner")
        list_id = (await w.service.lists.create(owner, owner, "l", False))["list_id"]
        await w.service.lists.add_member(owner, owner, list_id, gone)
        await w.drain()
        await w.service.lists.remove_member(owner, owner, list_id, gone)
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        leftovers = await rows_holding(own, gone)
        assert leftovers == only_tombstone(gone), (list_reader(owner, list_id), leftovers)


async def test_a_repost_whose_request_died_after_its_index_row_leaves_nothing(
    own: Storage,
) -> None:
    """U's repost request died between ``note_index`` (in the original author's partition)
    and the truth row (in U's): the index row names U, and nothing of U leads to it."""
    async with world(own) as w:
        gone, author = await new_users(w.repos, "gone", "author")
        post = await w.service.posts.create(author, author, "original")
        await w.drain()
        repost_id = new_post_id(now_ticks())
        await w.repos.reposts.note_index(author, post.post_id, gone, repost_id)
        # the reserved message shows up once hidden (its fact never stored)
        w.recorder.sent.append(
            Reposted(reposter=gone, author=author, post_id=post.post_id, repost_id=repost_id)
        )
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_reply_whose_request_died_after_its_index_row_leaves_nothing(
    own: Storage,
) -> None:
    """U's reply request died between ``note_reply`` (in the replied-to author's partition)
    and the reply's row: the index row names U, and nothing of U leads to it."""
    async with world(own) as w:
        gone, author = await new_users(w.repos, "gone", "author")
        post = await w.service.posts.create(author, author, "original")
        await w.drain()
        reply = Post(
            post_id=new_post_id(now_ticks()),
            author=gone,
            text="a reply",
            reply_author=author,
            reply_post=post.post_id,
        )
        await w.repos.reposts.note_reply(author, post.post_id, reply)
        w.recorder.sent.append(  # as the API sends it: with the post it answers
            PostCreated(
                author=gone, post_id=reply.post_id, reply_author=author, reply_post=post.post_id
            )
        )
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_every_message_of_the_accounts_life_redelivered_after_the_drop(
    own: Storage,
) -> None:
    """Each message the account's life sent (and its second pass), run again once the
    account's partitions are dropped: none recreates a row of it."""
    async with world(own) as w:
        gone, fan, friend, rep = await new_users(w.repos, "gone", "fan", "friend", "rep")
        s, history = w.service, []
        await s.follows.follow(fan, fan, gone)
        await s.follows.follow(gone, gone, friend)
        await s.follows.follow(fan, fan, rep)
        mine = await s.posts.create(gone, gone, "mine")
        theirs = await s.posts.create(friend, friend, "theirs")
        await s.posts.create(gone, gone, "a reply", reply_to=(friend, theirs.post_id))
        await s.reposts.repost(gone, gone, friend, theirs.post_id)
        await s.reposts.repost(rep, rep, gone, mine.post_id)
        own_list = (await s.lists.create(gone, gone, "mine", False))["list_id"]
        await s.lists.add_member(gone, gone, own_list, friend)
        history += w.recorder.sent
        await w.drain()
        await s.reposts.unrepost(gone, gone, theirs.post_id)
        await s.posts.delete(gone, gone, mine.post_id)
        history += w.recorder.sent
        await w.drain()
        await s.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)
        late = [*history, *(m.model_copy(update={"confirm": True}) for m in history
                            if "confirm" in type(m).model_fields)]  # fmt: skip
        w.recorder.sent.extend(late)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_merged_authors_deletion_with_overflow_readers_and_merged_follows(
    own: Storage,
) -> None:
    """U is merged (followers have merge rows, one is an overflow reader), and U itself
    follows a merged author as an overflow reader: after the deletion no merge, copy or
    post row of U is left, and no follower's pages show U."""
    recorder = Recorder(own, forward=False)
    async with PartitionWriter(own, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(own, writer, hybrid=HYBRID, timing=TIMING, queue=recorder)
        service = unlimited_service(own, recorder)
        repos = Repositories.on(own)
        gone, big1, big2, *fans = await new_users(
            repos, "gone", "big1", "big2", "f1", "f2", "f3", "f4", "f5"
        )
        for big in (big1, big2):  # two merged authors fill f1's and gone's merge rows
            for fan in (*fans, gone):
                await service.follows.follow(fan, fan, big)
        await run_all(processor, recorder)
        for big in (big1, big2):
            await regrade(processor, big, merge=True)
        for fan in fans:
            await service.follows.follow(fan, fan, gone)
        big3 = (await new_users(repos, "big3"))[0]
        for fan in fans:
            await service.follows.follow(fan, fan, big3)
        await service.follows.follow(gone, gone, big3)
        await run_all(processor, recorder)
        await regrade(processor, gone, merge=True)
        await regrade(processor, big3, merge=True)
        assert (await repos.audience.mode(gone)).state == MERGED
        assert await repos.audience.copy_etag(big3, gone) is not None  # gone: overflow
        post = await service.posts.create(gone, gone, "merged post")
        await service.reposts.repost(gone, gone, big1, (await service.posts.create(
            big1, big1, "big post")).post_id)  # fmt: skip
        await run_all(processor, recorder)
        counts = {big: await repos.follows.follower_count(big) for big in (big1, big2, big3)}

        await service.accounts.delete(gone, gone)
        await run_all(processor, recorder)

        for big in (big1, big2, big3):
            assert await repos.follows.follower_count(big) == counts[big] - 1
        for fan in fans:
            shown = [p for page in await home_pages(own, fan) for p in page]
            assert post.post_id not in shown
            assert gone not in await repos.audience.merged_authors(fan)
        assert await rows_holding(own, gone) == only_tombstone(gone)


def test_the_deletions_sweep_outlasts_every_api_write_of_the_account(
    azurite: Azurite, tmp_path: Path
) -> None:
    """The deletion sweeps again only after every write the API can still land for the
    account: one accepted up to ``credentials_cache_s`` after the tombstone (another
    process's cached state), landing up to the API's hidden time after it started; with
    the longest cache and with the test settings alike."""
    for overrides in ({"credentials_cache_s": 300.0, "worker_write_deadline_s": 300.0,
                       "worker_sweep_delay_s": None}, {}):  # fmt: skip
        settings = make_settings(azurite.connection_string, tmp_path, **overrides)
        latest_landing = settings.credentials_cache_s + settings.hidden_message_s()
        assert settings.fanout_timing().account_every_s > latest_landing, overrides


async def test_a_post_landing_before_the_second_sweep_is_undone(own: Storage) -> None:
    """A post accepted on a cached token lands after the first sweep: the second finds it."""
    async with world(own) as w:
        (gone,) = await new_users(w.repos, "gone")
        await w.service.accounts.delete(gone, gone)
        [deletion] = w.recorder.sent
        w.recorder.sent.clear()
        outcome = await w.processor.handle(deletion)
        while isinstance(outcome, Continue) and not getattr(outcome.message, "confirm", True):
            outcome = await w.processor.handle(outcome.message)
        assert isinstance(outcome, Continue)
        second_sweep = outcome.message
        late = Post(post_id=new_post_id(now_ticks()), author=gone, text="late")
        await w.repos.posts.add(late)
        w.recorder.sent += [PostCreated(author=gone, post_id=late.post_id), second_sweep]
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_lost_unfollow_does_not_hold_the_deletion_forever(own: Storage) -> None:
    """U has a follower F; the Unfollowed its deletion sends for F is lost once (parked in
    the poison queue after repeated failures, say): the next sweep finds F and sends it
    again."""
    async with world(own) as w:
        gone, follower = await new_users(w.repos, "gone", "follower")
        await w.service.follows.follow(follower, follower, gone)
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        work: list[FanoutMessage] = list(w.recorder.sent)
        w.recorder.sent.clear()
        lost, phases, polls = 0, [], 0
        while work and polls < 60:
            message = work.pop(0)
            if isinstance(message, Unfollowed) and message.subject == gone and not lost:
                lost += 1
                continue
            if isinstance(message, AccountDeleted):
                polls += 1
                phases.append((message.phase, message.confirm))
            outcome = await w.processor.handle(message)
            if isinstance(outcome, Continue):
                work.append(outcome.message)
            work.extend(w.recorder.sent)
            w.recorder.sent.clear()
        assert lost == 1
        assert polls < 60, phases[-5:]
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_a_mute_made_again_without_an_end_still_finds_its_muter(own: Storage) -> None:
    """M mutes U until soon, then again with no end; the sweep after the first end keeps the
    mute (it has no end now) and must keep its reverse row, or U's deletion misses M's
    ``m-{U}`` row."""
    async with world(own) as w:
        muter, other = await new_users(w.repos, "muter", "other")
        relations = w.repos.relations
        await relations.mute(muter, other, time.time() + 60, True)
        await relations.mute(muter, other, None, True)
        await Sweeper(own).sweep(now=time.time() + LATER)
        assert await relations.mute_of(muter, other) is not None
        await w.service.accounts.delete(other, other)
        await w.drain()
        assert await rows_holding(own, other) == only_tombstone(other)


async def test_a_follow_request_that_died_after_its_unfollowed_row_leaves_nothing(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """G asks to follow locked L; the request's first write (``~unfollowed-G`` in L's
    partition) lands and the process dies before G's index row. The request's message,
    shown once its hidden time ends, makes the index row, so G's deletion finds the pair."""
    async with world(own) as w:
        gone, locked = await new_users(w.repos, "gone", "locked")
        await w.service.accounts.edit(locked, locked, display_name=None, locked=True)

        async def dies(*args: object, **kwargs: object) -> None:
            raise Died

        with monkeypatch.context() as patch:
            patch.setattr(follows_module, "transact_counted", dies)
            with pytest.raises(Died):
                await w.service.follows.follow(gone, gone, locked)
        await w.drain()
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == [("users", gone, IDENTITY_ROW_KEY)]


async def test_a_merged_authors_merge_rows_leave_no_trace_naming_it(own: Storage) -> None:
    """U is merged at read time and its followers hold merge rows for it: removing each
    leaves a removal trace keyed by the row (``~gone-!m-{U}``), which names U; the pair's
    end drops it (a stream needs none: U has no posts left to merge)."""
    recorder = Recorder(own, forward=False)
    async with PartitionWriter(own, TIMELINES, linger_s=0) as writer:
        processor = FanoutProcessor.on(own, writer, hybrid=HYBRID, timing=TIMING, queue=recorder)
        service = unlimited_service(own, recorder)
        repos = Repositories.on(own)
        gone, *fans = await new_users(repos, "gone", *(f"f{i}" for i in range(HYBRID.threshold)))
        for fan in fans:
            await service.follows.follow(fan, fan, gone)
        await run_all(processor, recorder)
        await regrade(processor, gone, merge=True)
        assert all([gone in await repos.audience.merged_authors(fan) for fan in fans])
        await service.accounts.delete(gone, gone)
        await run_all(processor, recorder)
        assert await rows_holding(own, gone) == only_tombstone(gone)


async def test_an_undone_repost_whose_undo_is_still_running_is_left_to_it(
    own: Storage,
) -> None:
    """U undid a repost whose ``Unreposted`` has not run yet when U is deleted: the void
    repost row (no ``author`` on it) is left to that undo, which drops it (a chaos run
    poisoned the deletion on it)."""
    async with world(own) as w:
        gone, author = await new_users(w.repos, "gone", "author")
        post = await w.service.posts.create(author, author, "original")
        await w.service.reposts.repost(gone, gone, author, post.post_id)
        await w.drain()
        await w.service.reposts.unrepost(gone, gone, post.post_id)  # its undo not run yet
        assert (await w.repos.reposts.own_page(gone, 100, None)).items == []
        await w.service.accounts.delete(gone, gone)
        await w.drain()
        assert await rows_holding(own, gone) == only_tombstone(gone)
