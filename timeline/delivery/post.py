"""A post's delivery (``PostCreated``): its copies into one page of followers' timelines per
lease, each written within the write deadline of the reads that justified it, then re-checked.

The copies of a page are written only after reading that the post exists and that each
follower follows its author, and inside the write deadline of those reads (``admission``).
After they land, the follows and the post are read again: a copy whose reason disappeared
meanwhile is removed at once (the common race, fixed in milliseconds); the delete's or the
unfollow's second pass removes any that lands later still.
"""

from __future__ import annotations

import asyncio

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Defer, Outcome
from timeline.metrics import REPLY_FOLLOW_CHECKS
from timeline.model.entities import Post
from timeline.model.keys import post_id_ticks
from timeline.model.messages import PostCreated

_ARRIVAL_POLLS = (0.05, 0.1, 0.2)
"""Short in-process waits for a row the API is writing right after it queued the message."""


class PostDelivery:
    """Writes a post into its author's and its readers' timelines, one page per lease."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def deliver(self, message: PostCreated) -> Outcome:
        """Write the post into one page of followers' timelines (and the author's own)."""
        async with self._ctx.admission(self._ctx.expected_page_rows()) as deadline:
            post = await self._arrived_post(message)
            if post is None:
                return await self._missing_post(message)
            merged = message.merged
            if message.cursor is None:
                merged = not (await self._repos.audience.mode(post.author)).copies_to_followers
            posted_at = post.created_at.timestamp()
            page = await self._ctx.readers_page(
                post.author, merged, message.cursor, posted_at=posted_at
            )
            readers = await self._reply_readers(post, page.items)
            owners = readers if message.cursor is not None else [post.author, *readers]
            self._ctx.count_page_rows(len(owners))
            written = await self._feed.push(owners, post, deadline)
        await written.wait()
        await self._undo_lost_reasons(post, owners, readers)
        await self._feed.trim(
            [owner for owner in owners if self._feed.trim_due(owner, post.post_id)]
        )
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        return DONE

    async def _reply_readers(self, post: Post, readers: list[str]) -> list[str]:
        """A reply reaches only the readers who also follow the replied-to author (Mastodon's
        rule): one range query on that author's followers for the page."""
        target = post.reply_author
        if target is None or target == post.author or not readers:
            return readers
        also = await self._repos.follows.followers_between(target, readers[0], readers[-1])
        REPLY_FOLLOW_CHECKS.inc()
        return [reader for reader in readers if reader in also or reader == target]

    async def _arrived_post(self, message: PostCreated) -> Post | None:
        """The post; the API queues the message before it stores the post, so wait briefly."""
        post = await self._repos.posts.get(message.author, message.post_id)
        for pause in _ARRIVAL_POLLS:
            if post is not None or message.cursor is not None or not self._young_post(message):
                break
            await asyncio.sleep(pause)
            post = await self._repos.posts.get(message.author, message.post_id)
        return post

    async def _missing_post(self, message: PostCreated) -> Outcome:
        """No post: not stored yet, deleted, or never stored (then claim its id as void)."""
        if message.cursor is None and self._young_post(message):
            return Defer("the post is not stored yet")
        if message.cursor is None and not await self._repos.posts.void(
            message.author, message.post_id
        ):
            return Defer("the post was stored just now")
        return DONE  # gone: its delete's passes remove every copy

    def _young_post(self, message: PostCreated) -> bool:
        return self._ctx.young(post_id_ticks(message.post_id))

    async def _undo_lost_reasons(self, post: Post, owners: list[str], followers: list[str]) -> None:
        """Re-check after writing: undo copies whose follow or post disappeared meanwhile."""
        if followers:
            still = await self._repos.follows.followers_between(
                post.author, followers[0], followers[-1]
            )
            for follower in followers:
                if follower not in still:
                    await self._unpush_if_unfollowed(follower, post)
        if await self._repos.posts.get(post.author, post.post_id) is None:
            await self._feed.unpush(owners, post.post_id)

    async def _unpush_if_unfollowed(self, owner: str, post: Post) -> None:
        """Race-sensitive: read the copy, then the follow; delete the copy only if unchanged
        since that read, so a re-follow's backfill that rewrote it in between is kept."""
        etag = await self._repos.timelines.etag_of(owner, post.row_key)
        if etag is not None and not await self._repos.follows.is_following(owner, post.author):
            await self._repos.timelines.remove_unchanged(owner, [(post.row_key, etag)])
