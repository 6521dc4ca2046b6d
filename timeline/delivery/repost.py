"""A repost's delivery (``Reposted``) and its removal (``Unreposted``; a delete of the
original removes every repost of it: ``timeline.delivery.repost_purge``).

A repost's copy in a reader's timeline is keyed by the repost's id (``post_row_key``), so it
sorts where it was reposted, two reposts of one post are two rows (each removable on its
own), and a redelivery rewrites the same row. It holds the original's ``author`` and
``text`` with ``reposted_by`` and ``original`` (the original's id).

The same rules as a post's copies (docs/guarantees.md, "Reposts"): a copy is written only
after reading that the repost and its original are live and that the reader follows the
reposter (without ``reposts=false``), within the write deadline of those reads; after the
copies land, all three are read again and a copy whose reason went is removed at once; a
delete of the original and an un-repost each remove the copies twice, the second time a
sweep delay later, after every copy justified by an older read has landed or been dropped.

A reader never gets a repost's copy while its newest ``DEDUPE_WINDOW`` entries already show
the post (the original, or another repost of it): one query per reader per delivery.
"""

from __future__ import annotations

import asyncio

from timeline.delivery.context import Context
from timeline.delivery.feed import DEDUPE_WINDOW, Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.metrics import REPOST_DEDUPE_REQUESTS, REPOST_DEDUPED
from timeline.model.entities import Post
from timeline.model.keys import TICKS_PER_SECOND, UNIX_EPOCH_TICKS, post_id_ticks
from timeline.model.messages import Reposted, Unreposted
from timeline.tables.reposts import live_repost_id


def repost_copy(original: Post, message: Reposted | Unreposted) -> Post:
    """The row a repost leaves in its readers' timelines."""
    return Post(
        post_id=message.repost_id,
        author=original.author,
        text=original.text,
        reposted_by=message.reposter,
        original=original.post_id,
        reply_author=original.reply_author,
        reply_post=original.reply_post,
    )


class RepostDelivery:
    """Writes a repost into one page of the reposter's followers' timelines per lease."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def deliver(self, message: Reposted) -> Outcome:
        async with self._ctx.admission(self._ctx.expected_page_rows()) as deadline:
            row = await self._repos.reposts.truth(message.reposter, message.post_id)
            if live_repost_id(row) != message.repost_id:
                if row is None or row.get("repost_id") != message.repost_id:
                    await self._drop_orphan_index(message)
                return DONE  # never stored, or undone since (its un-repost removes copies)
            original = await self._repos.posts.get(message.author, message.post_id)
            if original is None:
                return DONE  # deleted: the delete's passes remove every repost's copies
            page = await self._repos.follows.repost_follower_ids_page(
                message.reposter, self._ctx.page_size, message.cursor, _seconds(message)
            )
            readers = await self._not_shown(page.items, message.post_id, message.reposter)
            copy = repost_copy(original, message)
            self._ctx.count_page_rows(len(readers))
            written = await self._feed.push(readers, copy, deadline)
        await written.wait()
        await self._undo_lost_reasons(message, copy, page.items, readers)
        await self._feed.trim([r for r in readers if self._feed.trim_due(r, copy.post_id)])
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        return DONE

    async def _drop_orphan_index(self, message: Reposted) -> None:
        """Its request died before the repost's row (or another repost of the post won):
        the index row it filed first leads nowhere, and its message shows only once every
        write of it has landed or never will, so it goes."""
        await self._repos.reposts.drop_index(
            message.author, message.post_id, message.reposter, message.repost_id
        )

    async def _not_shown(self, readers: list[str], post_id: str, reposter: str) -> list[str]:
        """The readers whose newest entries do not show the post yet (one query each). The
        reposter's own entries do not count: one of them with another id is a repost of the
        post no longer live (its undo removes it), so it must not stand in for this one."""
        timelines = self._repos.timelines
        shown = await asyncio.gather(
            *(timelines.newest_shown(reader, DEDUPE_WINDOW, reposter) for reader in readers)
        )
        REPOST_DEDUPE_REQUESTS.inc(len(readers))
        fresh = [reader for reader, ids in zip(readers, shown, strict=True) if post_id not in ids]
        REPOST_DEDUPED.inc(len(readers) - len(fresh))
        return fresh

    async def _undo_lost_reasons(
        self, message: Reposted, copy: Post, followers: list[str], readers: list[str]
    ) -> None:
        """Re-check after writing: the follows, the repost and the original."""
        if readers:
            still = await self._repos.follows.followers_between(
                message.reposter, followers[0], followers[-1]
            )
            for reader in readers:
                if reader not in still:
                    await self._feed.unpush_if_unfollowed(reader, message.reposter, copy.row_key)
        live, original = await asyncio.gather(
            self._repos.reposts.live_id(message.reposter, message.post_id),
            self._repos.posts.get(message.author, message.post_id),
        )
        if live != message.repost_id or original is None:
            await self._feed.unpush(readers, copy.post_id)


class RepostRetraction:
    """Removes a repost's copies on un-repost: page by page, and again a sweep delay later
    (a deleted original's reposts: ``timeline.delivery.repost_purge``)."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def retract(self, message: Unreposted) -> Outcome:
        reposts = self._repos.reposts
        if message.cursor is None and not message.confirm:
            await reposts.remove(message.reposter, message.post_id, message.repost_id)
        page = await self._repos.follows.follower_ids_page(
            message.reposter, self._ctx.page_size, message.cursor
        )
        await self._feed.unpush(page.items, message.repost_id)
        if message.confirm:
            await self._feed.sweep_traces(page.items)
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        if not message.confirm:
            sweep = message.model_copy(update={"cursor": None, "confirm": True})
            return Continue(sweep, delay_s=self._ctx.timing.sweep_delay_s)
        await reposts.drop_index(
            message.author, message.post_id, message.reposter, message.repost_id
        )
        await reposts.drop_void(message.reposter, message.post_id, message.repost_id)
        return DONE


def _seconds(message: Reposted) -> float:
    """When the repost was made (epoch seconds), for the dormant readers' skip."""
    return (post_id_ticks(message.repost_id) - UNIX_EPOCH_TICKS) / TICKS_PER_SECOND
