"""Replies to a deleted account (``ReplyDetached``): each reply, and every copy of it, comes
to answer nobody (``reply_author`` ``DETACHED``; the API shows ``reply_to.author`` null), so
no row of another user keeps the deleted id.

The account's deletion sends one message per reply filed under its posts (their ``~re-``
rows, which stay until its partition is dropped), in every sweep. A pass marks the reply's
own row first, then its copies: its author's and its readers', a page per lease, then those
of each of its reposts, one repost and one page of the reposter's readers per lease. Each
mark is a merge that never creates a row, so a pass can neither revive a removed copy nor
hold one in place: it only changes what a copy says.

Why none keeps the old id. Every copy is written from a read of the reply's row (a
delivery's, a repost's, a backfill's) and within the write deadline of that read. Once a
pass has marked the row, a copy written from an older read lands, or is dropped, within
that deadline; the second pass, ``sweep_delay_s`` later, marks it. A copy written from a
newer read is marked already. A pass that finds the reply gone ends: the delete's own passes
remove its copies. A reply whose request had not landed yet is found by a later sweep of the
deletion (the first runs at once; the second only after every request accepted before the
tombstone has landed). Readers are walked as a delete walks them, so the copies a delete
would find are the copies a pass marks.

A mark changes a copy's etag, so a removal that reads a copy's etag, then a follow, then
deletes only if unchanged, reads and decides again when it finds the copy changed
(``Feed.purge``, ``unpush_if_unfollowed``).
"""

from __future__ import annotations

from timeline.delivery.context import Context
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.entities import Page
from timeline.model.keys import post_row_key
from timeline.model.messages import ReplyDetached, RepostsPosition

INDEX_QUERIES = 5
"""Index queries a lease follows at most while storage answers them empty."""


class ReplyDetachment:
    """Marks a reply to a deleted account, and its copies, as answering nobody: in two
    passes, a bounded step per lease."""

    def __init__(self, context: Context) -> None:
        self._ctx = context
        self._repos = context.repos

    async def detach(self, message: ReplyDetached) -> Outcome:
        if message.reposts is not None:
            return await self._repost_step(message, message.reposts)
        author, post_id = message.author, message.post_id
        merged = message.merged
        if message.cursor is None:
            if not await self._repos.posts.detach_reply(author, post_id):
                return DONE  # never stored, or deleted (its delete's passes remove copies)
            merged = await self._ctx.never_copied(author, post_id)
        page = await self._ctx.readers_page(author, merged, message.cursor)
        owners = page.items if message.cursor else [author, *page.items]
        await self._repos.timelines.detach_reply(owners, post_row_key(post_id))
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        return self._next(message, RepostsPosition())

    async def _repost_step(self, message: ReplyDetached, start: RepostsPosition) -> Outcome:
        """One page of one repost's readers: the repost ``start`` is inside, or the next."""
        reposter, repost_id, cursor = start.reposter, start.repost_id, start.followers
        if reposter is None or repost_id is None or cursor is None:
            after = None if reposter is None or repost_id is None else (reposter, repost_id)
            index = await self._index_page(message, after)
            if not index.items:  # none left, or storage answered empty: from here next lease
                return self._next(message, None if index.continuation is None else start)
            (reposter, repost_id), cursor = index.items[0], None
        page = await self._repos.follows.follower_ids_page(reposter, self._ctx.page_size, cursor)
        await self._repos.timelines.detach_reply(page.items, post_row_key(repost_id))
        position = RepostsPosition(  # without followers: this repost is done, on to the next
            reposter=reposter, repost_id=repost_id, followers=page.continuation
        )
        return self._next(message, position)

    async def _index_page(
        self, message: ReplyDetached, after: tuple[str, str] | None
    ) -> Page[tuple[str, str]]:
        """The first repost filed under the reply after ``after``'s row, following storage's
        empty answers a few times."""
        reposts = self._repos.reposts
        page = await reposts.reposts_page(message.author, message.post_id, after, 1)
        for _ in range(INDEX_QUERIES):
            if page.items or page.continuation is None:
                break
            page = await reposts.reposts_page(
                message.author, message.post_id, after, 1, page.continuation
            )
        return page

    def _next(self, message: ReplyDetached, position: RepostsPosition | None) -> Outcome:
        """Go on from ``position`` in the reposts; after the last, the second pass, or the
        end."""
        if position is not None:
            return Continue(message.model_copy(update={"cursor": None, "reposts": position}))
        if message.confirm:
            return DONE
        update = {"cursor": None, "merged": False, "reposts": None, "confirm": True}
        return Continue(message.model_copy(update=update), delay_s=self._ctx.timing.sweep_delay_s)
