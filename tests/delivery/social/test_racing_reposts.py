"""Two repost requests of one post by one reposter racing (a client's retry, a double
click): the repost that ends up stored is delivered, and removed with its original."""

from __future__ import annotations

import pytest

from tests.conftest import unique
from tests.delivery.helpers import add_follow, add_posts, add_users, run_every_pass
from timeline.delivery.outcomes import DONE, Defer
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import StorageUnavailableError
from timeline.model.keys import arrival_deadline, new_post_id, now_ticks
from timeline.model.messages import PostDeleted, Reposted
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.writer import PartitionWriter
from timeline.tables.repositories import Repositories


async def _shown(repos: Repositories, owner: str) -> list[tuple[str, str | None]]:
    page = await repos.timelines.page(owner, 1000, None)
    return [(post.original or post.post_id, post.reposted_by) for post in page.items]


async def _setup(repos: Repositories) -> tuple[str, str, str, str]:
    author, reposter, reader = (unique(p) for p in ("author", "reposter", "reader"))
    await add_users(repos, author, reposter, reader)
    await add_follow(repos, reader, reposter)
    [post] = await add_posts(repos, author, 1)
    return author, reposter, reader, post.post_id


async def test_a_repost_that_met_another_live_one_is_delivered_once_that_one_is_undone(
    storage: Storage, repos: Repositories
) -> None:
    """Two repost requests of one post race (a client retry, a double click): both read no
    live repost. X is stored first; A's message is handled and, reading the row live naming
    X, must not end as 'replaced'. X is undone (void). A's write, still within its window, then
    replaces the void row: A is live (the API answered with A), so it must be delivered."""
    author, reposter, reader, post_id = await _setup(repos)
    ticks_a = now_ticks()
    a = Reposted(reposter=reposter, author=author, post_id=post_id, repost_id=new_post_id(ticks_a))
    await repos.reposts.note_index(author, post_id, reposter, a.repost_id)  # A: index, queue
    ticks_x = now_ticks()
    x_id = new_post_id(ticks_x)  # request X: index, queue, write (wins)
    await repos.reposts.note_index(author, post_id, reposter, x_id)
    await repos.reposts.create(
        reposter, author, post_id, x_id, not_after=arrival_deadline(ticks_x, 30.0)
    )
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        outcome = await worker.handle(a)
        await repos.reposts.remove(reposter, post_id, x_id)  # X undone
        await repos.reposts.create(  # request A's write lands, within its window
            reposter, author, post_id, a.repost_id, not_after=arrival_deadline(ticks_a, 30.0)
        )
        assert await repos.reposts.live_id(reposter, post_id) == a.repost_id
        if isinstance(outcome, Defer):  # it waited: the redelivery sees A
            outcome = await worker.handle(a)
        assert outcome == DONE
    assert await _shown(repos, reader) == [(post_id, reposter)]


async def test_a_deleted_originals_repost_goes_when_the_index_names_the_losing_request(
    storage: Storage, repos: Repositories
) -> None:
    """Two racing repost requests: X's index row is filed, then A's (upsert: the index now
    names A), X's write wins, A's fails (503). X is delivered. The original's delete purges
    the reposts the index names: A, whose remove found X and did nothing; X's copy stayed.
    The purge now acts on the repost the stored row names."""
    author, reposter, reader, post_id = await _setup(repos)
    ticks_x = now_ticks()
    x = Reposted(reposter=reposter, author=author, post_id=post_id, repost_id=new_post_id(ticks_x))
    ticks_a = now_ticks()
    a_id = new_post_id(ticks_a)
    await repos.reposts.note_index(author, post_id, reposter, x.repost_id)
    await repos.reposts.note_index(author, post_id, reposter, a_id)
    await repos.reposts.create(
        reposter, author, post_id, x.repost_id, not_after=arrival_deadline(ticks_x, 30.0)
    )
    with pytest.raises(StorageUnavailableError):
        await repos.reposts.create(
            reposter, author, post_id, a_id, not_after=arrival_deadline(ticks_a, 30.0)
        )
    async with PartitionWriter(storage, TIMELINES, linger_s=0) as writer:
        worker = FanoutProcessor.on(storage, writer)
        assert await worker.handle(x) == DONE
        assert await _shown(repos, reader) == [(post_id, reposter)]
        await run_every_pass(worker, PostDeleted(author=author, post_id=post_id))
    assert await repos.posts.get(author, post_id) is None
    assert await repos.reposts.live_id(reposter, post_id) is None
    assert await _shown(repos, reader) == []
