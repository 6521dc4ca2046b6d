"""What the fan-out worker does with each message: idempotent, bounded, and race-safe.

A post or delete message covers one page of the author's followers (1,000 by default); if
there are more, it first queues a continuation message for the next page, so several
workers share a huge fan-out and each message does bounded work in bounded memory.

Every write is followed by a re-check of the reason for it (the post still exists, the
follow still holds); if the reason is gone the write is undone. A delete or unfollow that
races a delivery therefore always wins, whichever order the storage sees them in.
"""

from __future__ import annotations

from collections.abc import Iterable

from timeline.entities import Post
from timeline.keys import post_id_ticks, post_row_key
from timeline.messages import FanoutMessage, Followed, PostCreated, PostDeleted, Unfollowed
from timeline.queue import FanoutQueue
from timeline.repositories import Repositories
from timeline.storage import Storage
from timeline.writer import PartitionWriter, Tracker

BACKFILL_POSTS = 250
"""A follow backfills one page: the newest posts a reader sees first."""


class FanoutProcessor:
    def __init__(
        self,
        repositories: Repositories,
        queue: FanoutQueue,
        writer: PartitionWriter,
        *,
        follower_page_size: int = 1000,
    ) -> None:
        self._repos = repositories
        self._queue = queue
        self._writer = writer
        self._page_size = follower_page_size

    @classmethod
    def on(cls, storage: Storage, writer: PartitionWriter, **options: int) -> FanoutProcessor:
        return cls(Repositories.on(storage), FanoutQueue(storage), writer, **options)

    async def handle(self, message: FanoutMessage) -> None:
        match message:
            case PostCreated():
                await self.deliver(message)
            case PostDeleted():
                await self.retract(message)
            case Followed():
                await self.backfill(message.follower, message.subject)
            case Unfollowed():
                await self.purge(message.follower, message.subject)

    async def deliver(self, message: PostCreated) -> None:
        """Write the post into one page of followers' timelines (and the author's own)."""
        post = await self._repos.posts.get(message.author, message.post_id)
        if post is None:
            return
        page = await self._repos.follows.follower_ids_page(
            post.author, self._page_size, message.cursor
        )
        if page.continuation is not None:
            await self._queue.send(message.model_copy(update={"cursor": page.continuation}))
        followers = page.items
        owners = followers if message.cursor is not None else [post.author, *followers]
        await self._put(owners, post)
        if followers:
            still = await self._repos.follows.followers_between(
                post.author, followers[0], followers[-1]
            )
            await self._remove([f for f in followers if f not in still], post.post_id)
        if await self._repos.posts.get(post.author, post.post_id) is None:
            await self._remove(owners, post.post_id)

    async def retract(self, message: PostDeleted) -> None:
        """Delete the source row first (so deliveries see it gone), then the copies."""
        author, post_id = message.author, message.post_id
        if message.cursor is None and await self._repos.posts.delete(author, post_id):
            await self._repos.users.adjust_counters(author, posts=-1)
        page = await self._repos.follows.follower_ids_page(author, self._page_size, message.cursor)
        if page.continuation is not None:
            await self._queue.send(message.model_copy(update={"cursor": page.continuation}))
        followers = page.items
        await self._remove(followers if message.cursor else [author, *followers], post_id)

    async def backfill(self, follower: str, subject: str) -> None:
        """Copy the subject's newest page of posts into the follower's timeline."""
        if not await self._repos.follows.is_following(follower, subject):
            return
        posts = (await self._repos.posts.page(subject, BACKFILL_POSTS, None)).items
        tracker = Tracker()
        for post in posts:
            await self._writer.upsert(follower, post.row_key, post.properties(), tracker)
        await tracker.wait()
        if not await self._repos.follows.is_following(follower, subject):
            await self.purge(follower, subject)
            return
        surviving = await self._repos.posts.surviving(subject, posts)
        await self._remove_rows(
            follower, [post.row_key for post in posts if post.post_id not in surviving]
        )

    async def purge(self, follower: str, subject: str) -> None:
        """Remove the subject's posts from the follower's timeline, unless followed again."""
        if await self._repos.follows.is_following(follower, subject):
            return
        keys = await self._repos.timelines.row_keys_by_author(follower, subject)
        await self._remove_rows(follower, keys)

    async def _put(self, owners: Iterable[str], post: Post) -> None:
        tracker = Tracker()
        created, row_key, properties = post_id_ticks(post.post_id), post.row_key, post.properties()
        for owner in owners:
            await self._writer.upsert(owner, row_key, properties, tracker, created_ticks=created)
        await tracker.wait()

    async def _remove(self, owners: Iterable[str], post_id: str) -> None:
        tracker = Tracker()
        row_key = post_row_key(post_id)
        for owner in owners:
            await self._writer.delete(owner, row_key, tracker)
        await tracker.wait()

    async def _remove_rows(self, owner: str, row_keys: Iterable[str]) -> None:
        tracker = Tracker()
        for row_key in row_keys:
            await self._writer.delete(owner, row_key, tracker)
        await tracker.wait()
