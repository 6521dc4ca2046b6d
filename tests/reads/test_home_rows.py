"""A home page read (the query's JSON rows straight to response items) gives exactly what was
written, whatever the texts hold."""

from __future__ import annotations

import pytest

from tests.conftest import unique
from timeline.config import Settings
from timeline.model.entities import Post, row_json
from timeline.model.keys import new_post_id, now_ticks
from timeline.reads.home import HomeTimeline, Position
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import TIMELINES

LONGEST_POST = "😀" * Settings.model_fields["max_post_chars"].metadata[-1].le
TEXTS = [
    "",
    "héllo wörld 😀 𝄞 \u2028 \u2029",
    LONGEST_POST,
    "quote \" apostrophe ' backslash \\ newline \n tab \t",
    "100% %27 %%",
    "\u0000 nul and \u007f",
    "<script>&amp;</script>",
]
AUTHORS = ["o-brien", "a_b", "Z", "x" * 64]


async def all_items(storage: Storage, owner: str, limit: int) -> list[dict[str, str]]:
    """Every page's items, the first page from the timeline's head, the rest by position."""
    home = HomeTimeline(storage, max_merged=20)
    items: list[dict[str, str]] = []
    position: Position | None = Position()
    while position is not None:
        rows, position = await home.rows(owner, limit, position)
        items += [row_json(row) for row in rows]
    return items


@pytest.mark.parametrize("limit", [250, 3])
async def test_home_items_are_as_written(storage: Storage, limit: int) -> None:
    owner, base = unique("reader"), now_ticks()
    posts = [
        Post(new_post_id(base + i * 10_000_019), AUTHORS[i % len(AUTHORS)], text)
        for i, text in enumerate(TEXTS * 3)
    ]
    await submit_batch(storage, TIMELINES, owner, [("upsert", p.to_entity(owner)) for p in posts])
    written = [post.to_json() for post in sorted(posts, key=lambda post: post.row_key)]
    assert await all_items(storage, owner, limit) == written


async def test_page_gives_the_posts_its_rows_name(storage: Storage) -> None:
    """``page`` (the stream's and the chaos checks' view) and ``rows`` agree."""
    owner, base = unique("reader"), now_ticks()
    posts = [Post(new_post_id(base + i), "author", text) for i, text in enumerate(TEXTS)]
    await submit_batch(storage, TIMELINES, owner, [("upsert", p.to_entity(owner)) for p in posts])
    home = HomeTimeline(storage, max_merged=20)
    page, _ = await home.page(owner, 250, Position())
    assert page == sorted(posts, key=lambda post: post.row_key)
