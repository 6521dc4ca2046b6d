"""A reader's home pages while an author is merged or was merged before.

Each interleaving is forced on real storage.
"""

from __future__ import annotations

from tests.delivery.helpers import add_follow, remove_follow
from tests.delivery.hybrid_helpers import HYBRID, add_post, home_pages, new_users
from tests.helpers import put_copies
from timeline.model.keys import now_ticks
from timeline.storage.accounts import Storage
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
    await put_copies(storage, reader, [old, *copies])  # copied while the author was small
    assert await repos.audience.add_merge(reader, author, HYBRID.max_merged)  # merged since
    await remove_follow(repos, reader, author)  # the API's part; the worker has not run yet
    for limit in (1, 2, 250):
        pages = await home_pages(storage, reader, limit=limit)
        assert [p for page in pages for p in page] == [old.post_id], limit
