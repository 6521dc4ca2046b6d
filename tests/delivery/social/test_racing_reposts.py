"""Two repost requests of one post by one reposter racing (a client's retry, a double
click): the repost that ends up stored is delivered, and removed with its original."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.delivery.helpers import run_every_pass
from tests.delivery.social.helpers import (
    posts_keys,
    reposter_with_readers,
    shown,
    stored_repost,
)
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.delivery.repost import RepostDelivery
from timeline.errors import StorageUnavailableError
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostDeleted, Reposted, Unreposted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories
from timeline.tables.reposts import REPOSTS_OF


async def _setup(repos: Repositories) -> tuple[str, str, str, str]:
    author, reposter, [reader], post_id = await reposter_with_readers(repos, 1)
    return author, reposter, reader, post_id


async def test_a_deleted_originals_repost_goes_when_the_index_names_the_losing_request(
    storage: Storage, repos: Repositories
) -> None:
    """Two racing repost requests: X's index row is filed, then A's, X's write wins, A's
    fails (503). X is delivered. The original's delete must remove X's copy: when the index
    had one row per reposter, A's replaced X's, and the purge voided only A (a no-op)."""
    author, reposter, reader, post_id = await _setup(repos)
    ticks_x = now_ticks()
    x = Reposted(reposter=reposter, author=author, post_id=post_id, repost_id=new_post_id(ticks_x))
    ticks_a = now_ticks()
    a_id = new_post_id(ticks_a)
    await repos.reposts.note_index(author, post_id, reposter, x.repost_id)
    await repos.reposts.note_index(author, post_id, reposter, a_id)
    await repos.reposts.create(reposter, author, post_id, x.repost_id)
    with pytest.raises(StorageUnavailableError):
        await repos.reposts.create(reposter, author, post_id, a_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        assert await worker.handle(x) == DONE
        assert await shown(repos, reader) == [(post_id, reposter)]
        await run_every_pass(worker, PostDeleted(author=author, post_id=post_id))
    assert await repos.posts.get(author, post_id) is None
    assert await repos.reposts.live_id(reposter, post_id) is None
    assert await shown(repos, reader) == []


async def test_a_resumed_purge_step_finishes_the_repost_it_stopped_inside(
    storage: Storage, repos: Repositories
) -> None:
    """The delete's purge voids X and stops after one follower page. A request A that read
    no live repost before X was stored then files its index row and lands over void X. The
    resumed step must still remove X from the followers past its cursor (when the index had
    one row per reposter, it found A's there and dropped X's cursor), and A goes too."""
    author, reposter, readers, post_id = await reposter_with_readers(repos, 3)
    ticks_a = now_ticks()
    a_id = new_post_id(ticks_a)  # request A read no live repost, then stalled
    x = await stored_repost(repos, reposter, author, post_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        assert await FanoutProcessor.on(storage, writer).handle(x) == DONE
        deleting = FanoutProcessor.on(storage, writer, follower_page_size=1)
        outcome: Outcome = await deleting.handle(PostDeleted(author=author, post_id=post_id))
        while isinstance(outcome, Continue):
            step = outcome.message
            assert isinstance(step, PostDeleted)
            if step.reposts is not None and step.reposts.followers is not None:
                break
            outcome = await deleting.handle(step)
        assert isinstance(outcome, Continue)  # stopped inside X's followers
        await repos.reposts.note_index(author, post_id, reposter, a_id)
        await repos.reposts.create(reposter, author, post_id, a_id)
        await run_every_pass(deleting, outcome.message)
        a = Reposted(reposter=reposter, author=author, post_id=post_id, repost_id=a_id)
        await run_every_pass(FanoutProcessor.on(storage, writer), a)
    for reader in readers:
        assert await shown(repos, reader) == [], reader


async def test_a_repost_is_not_held_back_by_an_undone_repost_of_the_same_reposter(
    storage: Storage, repos: Repositories
) -> None:
    """X is delivered; X is undone and A lands; A's delivery runs before X's undo does.
    X's copy still shows the post among the reader's newest entries, but it must not stand
    in for A: the undo removes it, and A would be live with no copy."""
    author, reposter, reader, post_id = await _setup(repos)
    ticks_a = now_ticks()
    a = Reposted(reposter=reposter, author=author, post_id=post_id, repost_id=new_post_id(ticks_a))
    await repos.reposts.note_index(author, post_id, reposter, a.repost_id)
    x = await stored_repost(repos, reposter, author, post_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        assert await worker.handle(x) == DONE
        await repos.reposts.remove(reposter, post_id, x.repost_id)  # the API's undo of X
        undo = Unreposted(reposter=reposter, author=author, post_id=post_id, repost_id=x.repost_id)
        await repos.reposts.create(reposter, author, post_id, a.repost_id)
        assert await worker.handle(a) == DONE
        await run_every_pass(worker, undo)
    assert await repos.reposts.live_id(reposter, post_id) == a.repost_id
    assert await shown(repos, reader) == [(post_id, reposter)]


@pytest.mark.parametrize("another_lands", [False, True])
async def test_a_late_copy_of_a_repost_goes_in_the_deletes_second_pass(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch, another_lands: bool
) -> None:
    """X's delivery read X and the original live before the delete; its write lands after
    the delete's first pass, and its worker dies before its re-check. The second pass must
    remove that copy, also when a racing request A landed over void X during the first pass
    (with one index row per reposter, A's replaced X's and the second pass never saw X)."""
    author, reposter, readers, post_id = await reposter_with_readers(repos, 2)
    ticks_a = now_ticks()
    a_id = new_post_id(ticks_a)  # request A read no live repost, then stalled
    x = await stored_repost(repos, reposter, author, post_id)
    release, pushing = asyncio.Event(), asyncio.Event()
    push = Feed.push

    async def held_push(self: Feed, *args: Any) -> Any:
        pushing.set()
        await release.wait()
        return await push(self, *args)

    async def dies(*_: object) -> None:
        raise RuntimeError("the worker died before its re-check")

    monkeypatch.setattr(Feed, "push", held_push)
    monkeypatch.setattr(RepostDelivery, "_undo_lost_reasons", dies)
    async with (
        PartitionWriter(storage, TIMELINES, linger_s=0) as delivering_writer,
        PartitionWriter(storage, TIMELINES, linger_s=0) as writer,
    ):
        delivering = asyncio.create_task(FanoutProcessor.on(storage, delivering_writer).handle(x))
        await pushing.wait()  # it read X live, the original live, the followers
        deleting = FanoutProcessor.on(storage, writer, follower_page_size=1)
        outcome: Outcome = await deleting.handle(PostDeleted(author=author, post_id=post_id))
        while isinstance(outcome, Continue):
            step = outcome.message
            assert isinstance(step, PostDeleted)
            if step.confirm:
                break
            if another_lands and step.reposts is not None and step.reposts.followers:
                another_lands = False
                await repos.reposts.note_index(author, post_id, reposter, a_id)
                await repos.reposts.create(reposter, author, post_id, a_id)
            outcome = await deleting.handle(step)
        assert isinstance(outcome, Continue)  # the second pass, due a sweep delay later
        release.set()  # X's copies land now, inside their write deadline
        with pytest.raises(RuntimeError):
            await delivering
        await run_every_pass(deleting, outcome.message)
    for reader in readers:
        assert await shown(repos, reader) == [], reader


async def test_a_repost_request_that_lost_a_race_leaves_no_index_row(
    storage: Storage, repos: Repositories
) -> None:
    """A request that lost a race can never be stored, so it has no entries: its index row
    goes, and a redo and undo of the repost leave none (an index row per repost would
    otherwise pile up until the original's delete)."""
    author, reposter, _, post_id = await _setup(repos)
    lost = new_post_id(now_ticks())
    await repos.reposts.note_index(author, post_id, reposter, lost)
    won = await stored_repost(repos, reposter, author, post_id)
    with pytest.raises(StorageUnavailableError):
        await repos.reposts.create(reposter, author, post_id, lost)
    assert len(await posts_keys(storage, author, REPOSTS_OF)) == 1  # the winner's
    await repos.reposts.remove(reposter, post_id, won.repost_id)
    undo = Unreposted(reposter=reposter, author=author, post_id=post_id, repost_id=won.repost_id)
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        await run_every_pass(FanoutProcessor.on(storage, writer), undo)
    assert await posts_keys(storage, author, REPOSTS_OF) == []
