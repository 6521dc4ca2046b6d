"""A deleted original's reposts, removed a bounded step per lease (``PostDeleted.reposts``).

A step walks the original's repost index (``~rpof-{post_id}-{reposter}-{repost_id}``, in key order)
from where the message says: at most ``REPOSTS_PER_STEP`` reposts, and at most one follower
page's worth (``follower_page_size``) of their reposters' followers, so its storage requests
are bounded however many reposts and followers there are. The index has a row per repost
(``index_row_key``), so every repost a request filed gets both passes. Each is voided, then its
entry removed from every follower of its reposter, page by page (a page may end the step: the
message then holds that reposter, its repost and the follower cursor); the delete's second
pass (``final``) then drops the repost's void and index rows, which the first pass leaves for
it. Every action is idempotent and every decision is read from storage, so a step repeated
(a redelivery, a crash mid-step) ends the same: a repost whose index row has gone was done.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.model.entities import Page
from timeline.model.messages import RepostsPosition

REPOSTS_PER_STEP = 10
"""Reposts a step handles at most (each: a void's read and write, and its follower pages)."""
QUERIES_PER_STEP = 2 * REPOSTS_PER_STEP
"""Follower-page queries a step makes at most (storage may answer a page short)."""


@dataclass
class _Budget:
    """What is left of a step: follower rows and follower-page queries."""

    rows: int
    queries: int = QUERIES_PER_STEP

    @property
    def spent(self) -> bool:
        return self.rows <= 0 or self.queries <= 0


class RepostPurge:
    """Removes every repost of a deleted original, one bounded step at a time."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def step(
        self, author: str, post_id: str, start: RepostsPosition, *, final: bool
    ) -> RepostsPosition | None:
        """One step from ``start``; where the next resumes, or None when every repost filed
        under the post is done."""
        budget = _Budget(rows=self._ctx.page_size)
        limit = REPOSTS_PER_STEP
        if start.reposter is not None and start.followers is not None:
            stopped = await self._resume(author, post_id, start, budget, final=final)
            if stopped is not None:
                return stopped
            limit -= 1
        after = _row(start)
        page = await self._index_page(author, post_id, after, limit, budget)
        for reposter, repost_id in page.items:
            if budget.spent:
                return _after(after)
            await self._repos.reposts.remove(reposter, post_id, repost_id)
            stopped = await self._repost(post_id, reposter, repost_id, None, budget)
            if stopped is not None:
                return stopped
            await self._finish(author, post_id, reposter, repost_id, final=final)
            after = (reposter, repost_id)
        return None if page.continuation is None else _after(after)

    async def _index_page(
        self,
        author: str,
        post_id: str,
        after: tuple[str, str] | None,
        limit: int,
        budget: _Budget,
    ) -> Page[tuple[str, str]]:
        """The next reposts in the index (storage may answer empty with a continuation:
        follow it while the step's queries last)."""
        reposts = self._repos.reposts
        page = await reposts.reposts_page(author, post_id, after, limit)
        while not page.items and page.continuation is not None and not budget.spent:
            budget.queries -= 1
            page = await reposts.reposts_page(author, post_id, after, limit, page.continuation)
        return page

    async def _resume(
        self, author: str, post_id: str, start: RepostsPosition, budget: _Budget, *, final: bool
    ) -> RepostsPosition | None:
        """Go on with the repost a step stopped inside: its followers from the cursor, while
        its index row is there (a repeated step may find it done: its row goes last)."""
        row = _row(start)
        if row is None:
            return None  # never made: a position inside a repost names it
        reposter, repost_id = row
        if not await self._repos.reposts.indexed(author, post_id, reposter, repost_id):
            return None
        stopped = await self._repost(post_id, reposter, repost_id, start.followers, budget)
        if stopped is None:
            await self._finish(author, post_id, reposter, repost_id, final=final)
        return stopped

    async def _repost(
        self,
        post_id: str,
        reposter: str,
        repost_id: str,
        cursor: dict[str, str] | None,
        budget: _Budget,
    ) -> RepostsPosition | None:
        """Remove the voided repost's entries page by page while the budget lasts; where to
        resume if it ran out first."""
        while True:
            page = await self._repos.follows.follower_ids_page(reposter, budget.rows, cursor)
            budget.rows -= len(page.items)
            budget.queries -= 1
            await self._feed.unpush(page.items, repost_id)
            if page.continuation is None:
                return None
            cursor = page.continuation
            if budget.spent:
                return RepostsPosition(reposter=reposter, repost_id=repost_id, followers=cursor)

    async def _finish(
        self, author: str, post_id: str, reposter: str, repost_id: str, *, final: bool
    ) -> None:
        """The second pass drops a done repost's void and index rows (the first leaves them:
        the second pass reads the index); the index row last, as it leads a redone step to
        the void row."""
        if final:
            await self._repos.reposts.drop_void(reposter, post_id, repost_id)
            await self._repos.reposts.drop_index(author, post_id, reposter, repost_id)


def _row(position: RepostsPosition) -> tuple[str, str] | None:
    """The index row a position names: its reposter and repost (None: from the first)."""
    if position.reposter is None or position.repost_id is None:
        return None
    return position.reposter, position.repost_id


def _after(row: tuple[str, str] | None) -> RepostsPosition:
    """Resume the walk after this index row (None: from the first)."""
    if row is None:
        return RepostsPosition()
    return RepostsPosition(reposter=row[0], repost_id=row[1])
