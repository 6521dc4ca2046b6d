"""A post's delivery (``PostCreated``): its copies into one page of followers' timelines per
lease, each written within the write deadline of the reads that justified it, then re-checked.

The copies of a page are written only after reading that the post exists and that each
follower follows its author, and inside the write deadline of those reads (``admission``).
After they land, the follows and the post are read again: a copy whose reason disappeared
meanwhile is removed at once (the common race, fixed in milliseconds); the delete's or the
unfollow's second pass removes any that lands later still.
"""

from __future__ import annotations

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.metrics import REPLY_FOLLOW_CHECKS
from timeline.model.entities import DETACHED, Post
from timeline.model.messages import PostCreated


class PostDelivery:
    """Writes a post into its author's and its readers' timelines, one page per lease."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def deliver(self, message: PostCreated) -> Outcome:
        """Write the post into one page of followers' timelines (and the author's own)."""
        async with self._ctx.admission(self._ctx.expected_page_rows()) as deadline:
            post = await self._repos.posts.get(message.author, message.post_id)
            if post is None:  # never stored, or deleted since (its delete's passes remove copies)
                if message.cursor is None and message.reply_author and message.reply_post:
                    await self._repos.reposts.drop_reply(
                        message.reply_author, message.reply_post, message.post_id
                    )  # its request may have died after filing it: every write has landed
                return DONE
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
        if target == DETACHED:  # answers a deleted account: its author's own copy only
            return []
        also = await self._repos.follows.followers_between(target, readers[0], readers[-1])
        REPLY_FOLLOW_CHECKS.inc()
        return [reader for reader in readers if reader in also or reader == target]

    async def _undo_lost_reasons(self, post: Post, owners: list[str], followers: list[str]) -> None:
        """Re-check after writing: undo copies whose follow or post disappeared meanwhile."""
        if followers:
            still = await self._repos.follows.followers_between(
                post.author, followers[0], followers[-1]
            )
            for follower in followers:
                if follower not in still:
                    await self._feed.unpush_if_unfollowed(follower, post.author, post.row_key)
        if await self._repos.posts.get(post.author, post.post_id) is None:
            await self._feed.unpush(owners, post.post_id)
