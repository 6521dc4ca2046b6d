"""What the fan-out worker does with each message: idempotent, and safe against races.

Every write is followed by a re-check of the reason for it (the post still exists, the
follow still holds); if the reason is gone the write is undone. A delete or unfollow that
races a delivery therefore always wins, whichever order the storage sees them in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from timeline.entities import Post
from timeline.messages import FanoutMessage, Followed, PostCreated, PostDeleted, Unfollowed
from timeline.repositories import Repositories

T = TypeVar("T")
BACKFILL_POSTS = 250
"""A follow backfills one page: the newest posts a reader sees first."""


async def for_each(
    items: Iterable[T], action: Callable[[T], Awaitable[None]], *, concurrency: int
) -> None:
    """Run ``action`` on every item with at most ``concurrency`` in flight; first error wins."""
    semaphore = asyncio.Semaphore(concurrency)

    async def run(item: T) -> None:
        async with semaphore:
            await action(item)

    try:
        async with asyncio.TaskGroup() as group:
            for item in items:
                group.create_task(run(item))
    except ExceptionGroup as errors:
        raise errors.exceptions[0] from None


class FanoutProcessor:
    def __init__(self, repositories: Repositories, *, write_concurrency: int) -> None:
        self._repos = repositories
        self._concurrency = write_concurrency

    async def handle(self, message: FanoutMessage) -> None:
        match message:
            case PostCreated():
                await self.deliver(message)
            case PostDeleted():
                await self.retract(message.author, message.post_id)
            case Followed():
                await self.backfill(message.follower, message.subject)
            case Unfollowed():
                await self.purge(message.follower, message.subject)

    async def deliver(self, message: PostCreated) -> None:
        """Write the post into the author's and every follower's timeline."""
        post = await self._repos.posts.get(message.author, message.post_id)
        if post is None:
            return
        await self._repos.timelines.put(post.author, post)
        async for followers in self._repos.follows.follower_chunks(post.author):
            await self._put_each(followers, post)
            still = await self._repos.follows.followers_between(
                post.author, followers[0], followers[-1]
            )
            await self._remove_each([f for f in followers if f not in still], post.post_id)
        if await self._repos.posts.get(post.author, post.post_id) is None:
            await self.retract(post.author, post.post_id)

    async def retract(self, author: str, post_id: str) -> None:
        """Delete the source row first, then every delivered copy."""
        if await self._repos.posts.delete(author, post_id):
            await self._repos.users.adjust_counters(author, posts=-1)
        await self._repos.timelines.remove(author, post_id)
        async for followers in self._repos.follows.follower_chunks(author):
            await self._remove_each(followers, post_id)

    async def backfill(self, follower: str, subject: str) -> None:
        """Copy the subject's newest page of posts into the follower's timeline."""
        if not await self._repos.follows.is_following(follower, subject):
            return
        posts = (await self._repos.posts.page(subject, BACKFILL_POSTS, None)).items
        await self._repos.timelines.put_many(follower, posts)
        if not await self._repos.follows.is_following(follower, subject):
            await self.purge(follower, subject)
            return
        surviving = await self._repos.posts.surviving(subject, posts)
        gone = [post.row_key for post in posts if post.post_id not in surviving]
        await self._repos.timelines.remove_many(follower, gone)

    async def purge(self, follower: str, subject: str) -> None:
        """Remove the subject's posts from the follower's timeline, unless followed again."""
        if await self._repos.follows.is_following(follower, subject):
            return
        keys = await self._repos.timelines.row_keys_by_author(follower, subject)
        await self._repos.timelines.remove_many(follower, keys)

    async def _put_each(self, owners: list[str], post: Post) -> None:
        async def put(owner: str) -> None:
            await self._repos.timelines.put(owner, post)

        await for_each(owners, put, concurrency=self._concurrency)

    async def _remove_each(self, owners: list[str], post_id: str) -> None:
        async def remove(owner: str) -> None:
            await self._repos.timelines.remove(owner, post_id)

        await for_each(owners, remove, concurrency=self._concurrency)
