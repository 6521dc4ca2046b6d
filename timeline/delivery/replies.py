"""Replies to a deleted account (``ReplyDetached``): each reply, and every copy of it, comes
to answer nobody (``reply_author`` ``DETACHED``; the API shows ``reply_to.author`` null), so
no row of another user keeps the deleted id.

The account's deletion sends one message per reply filed under its posts (their ``~re-``
index rows), in every sweep, and is not over while any such row is left. A pass marks the
reply's own row first, then notes on the index row which sweep sent it (``detaching``: the
next sweep does not send it again, the one after does, should the message have been lost),
then the copies: its author's and its readers', a page per lease, then those of each of its
reposts, one repost and one page of the reposter's readers per lease; a second pass,
``sweep_delay_s`` later, does it all again, then drops the index row. So each copy is
marked twice, more only when a message waits longer than a sweep before its first pass or
a whole sweep between its passes (a duplicate: a mark is idempotent).
Each mark is a merge that never creates a row, so a pass can neither revive a removed copy
nor hold one in place: it only changes what a copy says.

Why none keeps the old id:
- A copy written from a read of the reply's row (a delivery's, a repost's, a backfill's)
  lands, or is dropped, within the write deadline of that read: one read before the mark
  lands before the second pass, which marks it; one read after copies the mark.
- A reader the passes did not walk (no follower then) holds a copy only until its unfollow's
  purge, which deletes it, or, finding it following again, marks it (``Feed.reconcile``).
- A reply not stored when a pass runs: the API reads the tombstone under the request's write
  deadline and refuses a reply to a deleted account, so a reply it accepts lands within its
  hidden time of the tombstone, before the deletion's second sweep, whose message finds it.
  A first pass sent by a later sweep, or a second pass (its first found the reply), that
  finds no reply drops the index row: it never will be stored, or is deleted (its delete
  removes its copies).
- The deleted account's own replies go with its posts (their deletes drop their index rows).
- A removal that read a copy's etag, then a follow, then deletes only if unchanged, reads
  and decides again when a mark changed the copy (``Feed.purge``,
  ``Feed.unpush_if_unfollowed``).
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
            own = author == message.target  # the account's own reply goes with its posts
            posts = self._repos.posts
            if own:
                stored = await posts.get(author, post_id) is not None
            else:
                stored = await posts.detach_reply(author, post_id)
            if not stored and (message.sweep or message.confirm):
                await self._drop_index(message)  # it never will be stored, or is deleted
            if own or not stored:
                return DONE
            if not message.confirm:  # the deletion's next sweep does not send it again
                await self._repos.reposts.note_detaching(
                    message.target, message.target_post, post_id, message.sweep
                )
            merged = await self._ctx.never_copied(author, post_id)
        page = await self._ctx.readers_page(author, merged, message.cursor)
        owners = page.items if message.cursor else [author, *page.items]
        await self._repos.timelines.detach_reply(owners, post_row_key(post_id))
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        return await self._next(message, RepostsPosition())

    async def _repost_step(self, message: ReplyDetached, start: RepostsPosition) -> Outcome:
        """One page of one repost's readers: the repost ``start`` is inside, or the next."""
        reposter, repost_id, cursor = start.reposter, start.repost_id, start.followers
        if reposter is None or repost_id is None or cursor is None:
            after = None if reposter is None or repost_id is None else (reposter, repost_id)
            index = await self._index_page(message, after)
            if not index.items:  # none left, or storage answered empty: from here next lease
                return await self._next(message, None if index.continuation is None else start)
            (reposter, repost_id), cursor = index.items[0], None
        page = await self._repos.follows.follower_ids_page(reposter, self._ctx.page_size, cursor)
        await self._repos.timelines.detach_reply(page.items, post_row_key(repost_id))
        position = RepostsPosition(  # without followers: this repost is done, on to the next
            reposter=reposter, repost_id=repost_id, followers=page.continuation
        )
        return await self._next(message, position)

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

    async def _next(self, message: ReplyDetached, position: RepostsPosition | None) -> Outcome:
        """Go on from ``position`` in the reposts; after the last, the second pass, or the
        end: then the reply's index row goes, so the deletion's sweeps stop sending it."""
        if position is not None:
            return Continue(message.model_copy(update={"cursor": None, "reposts": position}))
        if message.confirm:
            await self._drop_index(message)
            return DONE
        update = {"cursor": None, "merged": False, "reposts": None, "confirm": True}
        return Continue(message.model_copy(update=update), delay_s=self._ctx.timing.sweep_delay_s)

    async def _drop_index(self, message: ReplyDetached) -> None:
        await self._repos.reposts.drop_reply(message.target, message.target_post, message.post_id)
