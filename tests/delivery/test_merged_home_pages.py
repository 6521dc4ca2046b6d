"""A reader's home pages while an author is merged or was merged before.

Each interleaving is forced on real storage.
"""

from __future__ import annotations

from tests.delivery.helpers import add_follow, remove_follow
from tests.delivery.hybrid_helpers import HYBRID, add_post, home_pages, new_users
from timeline.model.keys import now_ticks
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.tables.repositories import Repositories


async def test_an_unfollowed_merged_authors_copies_never_show(
    storage: Storage, repos: Repositories
) -> None:
    """Right after an unfollow of a merged author (before the worker removes the merge row
    and purges), the reader's partition still holds the author's copies from before it was
    merged: every page hides them, at any limit (pages may be short, even empty, with a
    continuation meanwhile, as the README says)."""
    author, small, reader = await new_users(repos, "large", "small", "reader")
    await add_follow(repos, reader, author)
    await add_follow(repos, reader, small)
    base = now_ticks()
    old = await add_post(repos, small, base - 10_000_000)
    copies = [await add_post(repos, author, base - i * 1000) for i in range(8)]
    await repos.timelines.put_many(reader, [old, *copies])  # copied while the author was small
    assert await repos.audience.add_merge(reader, author, HYBRID.max_merged)  # merged since
    await remove_follow(repos, reader, author)  # the API's part; the worker has not run yet
    for limit in (1, 2, 250):
        pages = await home_pages(storage, reader, limit=limit)
        assert [p for page in pages for p in page] == [old.post_id], limit


async def test_a_pre_hybrid_continuation_still_pages(storage: Storage, repos: Repositories) -> None:
    """A home timeline continuation minted before this change (a storage continuation
    plus ``n``) is claimed to keep working; check it with the emulator's own format."""
    from timeline.service.timelines import _home_position
    from timeline.storage.calls import query_page

    reader, small = await new_users(repos, "reader", "small")
    posts = [await add_post(repos, small, now_ticks() - i * 1000) for i in range(3)]
    await repos.timelines.put_many(reader, posts)
    page = await query_page(
        storage.reader(TIMELINES, reader),
        "PartitionKey eq @pk and RowKey lt @meta",
        {"pk": reader, "meta": "~"},
        select=["RowKey"],
        limit=1,
        continuation=None,
    )
    assert page.continuation is not None
    old_token = {**page.continuation, "n": "1"}
    position, served = _home_position(old_token)
    assert served == 1
    home = HomeTimeline(storage, max_merged=HYBRID.max_merged)
    rest: list[str] = []
    following: Position | None = position
    while following is not None:
        items, following = await home.page(reader, 1, following)
        rest.extend(item.post_id for item in items)
    newest_first = sorted(posts, key=lambda post: post.row_key)
    assert rest == [post.post_id for post in newest_first[1:]]
