"""A post's delete (``PostDeleted``): the source row, then every copy, page by page, then
every repost of the post, a bounded step at a time (``timeline.delivery.repost_purge``); then
the whole again once ``sweep_delay_s`` later for copies that landed late (that pass also
sweeps each timeline's expired removal traces: one query per timeline, and drops the
reposts' index and void rows)."""

from __future__ import annotations

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.repost_purge import RepostPurge
from timeline.model.messages import PostDeleted, RepostsPosition


class PostRetraction:
    """Removes a deleted post from its author's and its readers' timelines, and its reposts
    from their reposters' followers', in two passes."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed
        self._reposts = RepostPurge(context, feed)

    async def retract(self, message: PostDeleted) -> Outcome:
        """Delete the source row first (so deliveries see it gone), then the copies, page by
        page, then the reposts; then once more after ``sweep_delay_s`` for late copies."""
        if message.reposts is not None:
            return await self._purge_reposts(message, message.reposts)
        author, post_id = message.author, message.post_id
        if message.cursor is None and not message.confirm:
            await self._repos.posts.delete(author, post_id)
            if message.reply_author is not None and message.reply_post is not None:
                await self._repos.reposts.drop_reply(
                    message.reply_author, message.reply_post, post_id
                )
        merged = message.merged
        if message.cursor is None:
            merged = await self._ctx.never_copied(author, post_id)
        page = await self._ctx.readers_page(author, merged, message.cursor)
        owners = page.items if message.cursor else [author, *page.items]
        await self._feed.unpush(owners, post_id)
        if message.confirm:  # the second pass sweeps the expired traces the deletes leave
            await self._feed.sweep_traces(owners)
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        return await self._purge_reposts(message, RepostsPosition())

    async def _purge_reposts(self, message: PostDeleted, start: RepostsPosition) -> Outcome:
        """One step of the reposts' purge (in both passes: a repost racing the delete,
        docs/guarantees.md); after the last, the second pass, or the end."""
        position = await self._reposts.step(
            message.author, message.post_id, start, final=message.confirm
        )
        if position is not None:
            return Continue(message.model_copy(update={"cursor": None, "reposts": position}))
        if not message.confirm:
            update = {"cursor": None, "confirm": True, "merged": False, "reposts": None}
            sweep = message.model_copy(update=update)
            return Continue(sweep, delay_s=self._ctx.timing.sweep_delay_s)
        return DONE
