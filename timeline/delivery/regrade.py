"""An author's move between copied and merged at read time (``Regrade``), and the sends that
start one when its follower count crosses the threshold."""

from __future__ import annotations

import asyncio
import logging
import uuid

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.settings import Hybrid
from timeline.model.keys import now_ticks
from timeline.model.messages import Regrade
from timeline.tables.audience import COPIED, GROWING, MERGED, SHRINKING, AuthorMode
from timeline.tables.repositories import Repositories

log = logging.getLogger(__name__)


class Regrading:
    """Moves an author to ``merged`` or back to ``copied``, one page of followers per lease."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def regrade(self, message: Regrade) -> Outcome:
        """Move the author to ``merged`` or back to ``copied``, one page of followers per
        lease. The mode row says who owns the move: the first page takes it (only if the move
        is still due), later pages and redeliveries go on only while they own it.

        Up: the author is ``growing`` (posts still copied, readers already merge) until every
        follower has a merge row or an overflow row; only then ``merged``. Down: ``shrinking``
        (posts copied again), then one sweep delay so that every copy written on a read from
        the merged era has landed or been dropped; then every follower gets the newest posts
        copied, its copies of deleted posts removed, and loses its merge row; then
        ``copied``. Followers who arrive meanwhile are handled by their own follow (merge row
        while growing, copies while shrinking)."""
        audience, author = self._repos.audience, message.author
        moving, settled = (GROWING, MERGED) if message.merge else (SHRINKING, COPIED)
        mode = await audience.mode(author)
        if mode.state != moving or mode.token != message.token:
            if message.cursor is not None or not await self._still_due(author, mode, message):
                return DONE
            if not await audience.change_mode(author, mode, moving, token=message.token):
                return DONE  # another move took it first
        if not message.merge and not message.fenced:
            fenced = message.model_copy(update={"fenced": True})
            return Continue(fenced, delay_s=self._ctx.timing.sweep_delay_s)
        page = await self._repos.follows.follower_ids_page(
            author, self._ctx.page_size, message.cursor
        )
        if not await self._owns(message):
            return DONE  # a stale copy of this page: the move ended without it
        if message.merge:
            await self._feed.merge_page(page.items, author)
            if not await self._owns(message):  # it stalled past the end of its move
                await asyncio.gather(*(self._take_back(f, author) for f in page.items))
        else:
            unmerge = (self._unmerge(follower, message) for follower in page.items)
            await asyncio.gather(*unmerge)
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        mode = await audience.mode(author)
        if mode.state == moving and mode.token == message.token:
            since = now_ticks() if message.merge else 0
            if await audience.change_mode(author, mode, settled, since=since):
                log.info("author %s is now %s", author, settled)
                # crossed back while it moved
                await queue_regrade_if_due(self._repos, self._ctx.hybrid, author)
        return DONE

    async def _still_due(self, author: str, mode: AuthorMode, message: Regrade) -> bool:
        followers = await self._repos.follows.reach(author)
        hybrid = self._ctx.hybrid
        due = hybrid.merge_due if message.merge else hybrid.copy_due
        return due(mode, followers)

    async def _owns(self, message: Regrade) -> bool:
        """The author's mode still names this message's move."""
        mode = await self._repos.audience.mode(message.author)
        moving = GROWING if message.merge else SHRINKING
        return mode.state == moving and mode.token == message.token

    async def _take_back(self, follower: str, author: str) -> None:
        """Remove the rows a stale page of a move up wrote, read before the mode shows the
        author is neither growing nor merged (a later move up rewrites them, so they stay)."""
        audience = self._repos.audience
        merge, copy = await asyncio.gather(
            audience.merge_etag(follower, author), audience.copy_etag(author, follower)
        )
        if (await audience.mode(author)).state in (GROWING, MERGED):
            return
        if merge is not None:
            await audience.remove_merge(follower, author, merge)
        if copy is not None:
            await audience.remove_copy(author, follower, copy)

    async def _unmerge(self, follower: str, message: Regrade) -> None:
        """Copy the author's newest posts to a follower and remove its copies of deleted
        posts, then drop its merge or overflow row: only as read while this move still owned
        the author (a later move up rewrites them, so then they stay)."""
        audience, author = self._repos.audience, message.author
        merge, copy = await asyncio.gather(
            audience.merge_etag(follower, author), audience.copy_etag(author, follower)
        )
        if not await self._owns(message):
            return
        await self._feed.copy_newest(follower, author)
        await self._feed.reconcile(follower, author)
        if merge is not None:
            await audience.remove_merge(follower, author, merge)
        if copy is not None:
            await audience.remove_copy(author, follower, copy)


async def queue_regrade_if_due(repositories: Repositories, hybrid: Hybrid, author: str) -> bool:
    """Send a ``Regrade`` when the author's reach (followers and list memberships) has
    crossed the threshold (up) or half of it (down); True if one was sent. It is sent before
    anything changes, and it changes the mode only if still due, so a lost or duplicated send
    is harmless: the next follow or unfollow sends again, a duplicate finds the move taken."""
    if hybrid.queue is None:
        return False
    mode, followers = await asyncio.gather(
        repositories.audience.mode(author), repositories.follows.reach(author)
    )
    if not (hybrid.merge_due(mode, followers) or hybrid.copy_due(mode, followers)):
        return False
    merge = mode.state == COPIED
    await hybrid.queue.send(Regrade(author=author, merge=merge, token=uuid.uuid4().hex))
    return True


async def queue_due_regrades(
    repositories: Repositories, hybrid: Hybrid, authors: list[str] | None, *, resume: bool = False
) -> list[str]:
    """``queue_regrade_if_due`` for these authors (None: every author past the threshold or
    with a mode row); with ``resume``, a move left midway (its message parked as poison,
    say) is sent again under its own token. The authors a ``Regrade`` was sent for."""
    if authors is None:
        candidates = repositories.audience.authors_to_check(hybrid.threshold)
        authors = [author async for author in candidates]
    sent = []
    for author in authors:
        mode = await repositories.audience.mode(author)
        if resume and mode.state in (GROWING, SHRINKING) and hybrid.queue is not None:
            resumed = Regrade(author=author, merge=mode.state == GROWING, token=mode.token)
            await hybrid.queue.send(resumed)
            sent.append(author)
        elif await queue_regrade_if_due(repositories, hybrid, author):
            sent.append(author)
    return sent
