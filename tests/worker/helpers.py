"""What several worker tests set up: an author with many followers, a timeline's ids."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.conftest import unique
from timeline.model.entities import Post, User
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.calls import chunked
from timeline.storage.names import SUBJECT_FOLLOWERS
from timeline.tables.repositories import Repositories


async def author_with_followers(
    storage: Storage, repos: Repositories, followers: int
) -> tuple[str, Post]:
    """An author with ``followers`` follower rows (written in EGT batches) and one post."""
    author = unique("author")
    now = datetime.now(UTC)
    await repos.users.create(User(author, author, created_at=now))
    rows = [
        ("upsert", {"PartitionKey": author, "RowKey": f"f{i:05d}", "since": now})
        for i in range(followers)
    ]
    for batch in chunked(rows):
        await storage.table(SUBJECT_FOLLOWERS, author).submit_transaction(batch)
    post = Post(new_post_id(now_ticks()), author, "hello")
    await repos.posts.add(post)
    return author, post


async def timeline_ids(repos: Repositories, owner: str) -> list[str]:
    return [post.post_id for post in (await repos.timelines.page(owner, 10, None)).items]
