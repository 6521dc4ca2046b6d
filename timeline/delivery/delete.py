"""A post's delete (``PostDeleted``): the source row, then every copy, page by page, then the
whole again once ``sweep_delay_s`` later for copies that landed late (that pass also sweeps
each timeline's expired removal traces: one query per timeline). Each pass's first page also
removes every repost of the post (``RepostRetraction.purge_reposts_of``)."""

from __future__ import annotations

from timeline.delivery.context import TICKS_PER_SECOND, Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.repost import RepostRetraction
from timeline.model.keys import post_id_ticks
from timeline.model.messages import PostDeleted
from timeline.tables.audience import MERGED, AuthorMode


class PostRetraction:
    """Removes a deleted post from its author's and its readers' timelines, in two passes."""

    def __init__(
        self, context: Context, feed: Feed, reposts: RepostRetraction | None = None
    ) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed
        self._reposts = reposts or RepostRetraction(context, feed)

    async def retract(self, message: PostDeleted) -> Outcome:
        """Delete the source row first (so deliveries see it gone), then the copies, page by
        page; then once more after ``sweep_delay_s`` for copies that landed late."""
        author, post_id = message.author, message.post_id
        if message.cursor is None and not message.confirm:
            await self._repos.posts.delete(author, post_id)
            if message.reply_author is not None and message.reply_post is not None:
                await self._repos.reposts.drop_reply(
                    message.reply_author, message.reply_post, post_id
                )
        merged = message.merged
        if message.cursor is None:
            merged = self._never_copied(await self._repos.audience.mode(author), post_id)
        if message.cursor is None:  # in both passes: a repost racing the delete (guarantees)
            await self._reposts.purge_reposts_of(author, post_id, final=message.confirm)
        page = await self._ctx.readers_page(author, merged, message.cursor)
        owners = page.items if message.cursor else [author, *page.items]
        await self._feed.unpush(owners, post_id)
        if message.confirm:  # the second pass sweeps the expired traces the deletes leave
            await self._feed.sweep_traces(owners)
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        if not message.confirm:
            sweep = message.model_copy(update={"cursor": None, "confirm": True, "merged": False})
            return Continue(sweep, delay_s=self._ctx.timing.sweep_delay_s)
        return DONE

    def _never_copied(self, mode: AuthorMode, post_id: str) -> bool:
        """No follower but overflow readers can hold a copy: the author has been merged since
        before the post was made (by more than any delivery's write deadline and clock skew:
        every delivery of it read the author merged)."""
        margin = round(self._ctx.timing.sweep_delay_s * TICKS_PER_SECOND)
        return mode.state == MERGED and post_id_ticks(post_id) > mode.since + margin
