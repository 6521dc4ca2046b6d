"""A follow (``Followed``) and an unfollow (``Unfollowed``): the follower's timeline gets the
subject's newest posts and reposts (or a merge row, for an author merged at read time), or
loses them, now and once more ``sweep_delay_s`` later.

A *toggling* pair (unfollowed within ``cooldown_s``, by the pair's index row) is damped: an
unfollow that comes within the cool-down of the previous one leaves the copies in place and
its second pass purges only once the pair has stayed unfollowed for the cool-down; a follow
within the cool-down of an unfollow copies only the posts the timeline lacks (then once
more, ``sweep_delay_s`` later, for what a purge in flight took meanwhile). So a pair toggled
n times costs one purge and one backfill, not n (docs/guarantees.md, "Follow toggles").
"""

from __future__ import annotations

import time

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.delivery.regrade import queue_regrade_if_due
from timeline.model.keys import list_owner
from timeline.model.messages import Followed, Unfollowed
from timeline.tables.audience import GROWING, MERGED


class FollowChanges:
    """Backfills a follower's timeline on a follow; purges it on an unfollow."""

    def __init__(self, context: Context, feed: Feed) -> None:
        self._ctx = context
        self._repos = context.repos
        self._feed = feed

    async def backfill(self, message: Followed) -> Outcome:
        """Copy the subject's newest posts and reposts into the follower's timeline; undo
        what lost its reason by the time the copies landed."""
        follower, subject = message.follower, message.subject
        follows = self._repos.follows
        if message.confirm:
            if await follows.is_following(follower, subject):
                await self._feed.copy_newest(follower, subject, missing_only=True, reposts=True)
            return DONE
        if not await follows.is_following(follower, subject):
            await follows.sync_index(follower, subject)
            if (await follows.history(follower, subject)).left_at:  # ended: maybe by an
                return Continue(Unfollowed(follower=follower, subject=subject))  # earlier run
            return DONE  # never made
        if await self._blocked(follower, subject):
            return await self._end_blocked(follower, subject)
        damped = False
        if not await self._merge_for(follower, subject):
            damped = await self._toggling(follower, subject)
            await self._feed.copy_newest(follower, subject, missing_only=damped, reposts=True)
        await follows.sync_index(follower, subject)
        await queue_regrade_if_due(self._repos, self._ctx.hybrid, subject)
        if damped:
            again = message.model_copy(update={"confirm": True})
            return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
        return DONE

    async def _blocked(self, follower: str, subject: str) -> bool:
        """Whether either side blocks the other (a list's reader: its owner)."""
        return await self._repos.relations.blocked_either(list_owner(follower) or follower, subject)

    async def _end_blocked(self, follower: str, subject: str) -> Outcome:
        """A follow that a block raced (its request died before its own re-check): end it
        here and go on as its unfollow, whose passes purge what any copy left.

        The unfollow is carried only by this message's rewrite, after the follow is gone: if
        the lease is lost first (a freeze, a killed worker, two workers holding the message),
        the ``Followed`` comes back unchanged and finds no follow, the block perhaps lifted
        since. So a ``Followed`` that finds no follow where the pair's index row records an
        unfollow goes on as the unfollow too (``backfill``): a re-run ends as the first run
        did, and an extra unfollow after the pair's own purges nothing more. The index is
        synced while the follow still stands, so the sync after the removal records the
        unfollow even for a pair whose request died before its own sync."""
        await self._repos.follows.sync_index(follower, subject)  # active first: the sync
        await self._repos.follows.remove(follower, subject)  # after the removal records it
        await self._repos.follows.sync_index(follower, subject)  # ended (``left_at``)
        ended = Unfollowed(follower=follower, subject=subject)
        return Continue(ended)

    async def _toggling(self, follower: str, subject: str) -> bool:
        """Whether this follow comes within the cool-down of an unfollow of the pair."""
        history = await self._repos.follows.history(follower, subject)
        return time.time() - history.left_at < self._ctx.timing.cooldown_s

    async def _purge_deferred(self, follower: str, subject: str) -> bool:
        """Whether an unfollow's first pass leaves the purge to its second: the previous
        unfollow of the pair was within the cool-down (a toggling pair)."""
        history = await self._repos.follows.history(follower, subject)
        return time.time() - history.previous_unfollow < self._ctx.timing.cooldown_s

    async def _unquiet_for(self, follower: str, subject: str) -> float:
        """Seconds until the pair has stayed unfollowed for the cool-down (0: it has)."""
        history = await self._repos.follows.history(follower, subject)
        return max(0.0, history.left_at + self._ctx.timing.cooldown_s - time.time())

    async def _merge_for(self, follower: str, subject: str) -> bool:
        """True if the subject is merged at read time and the follower got a merge row. If a
        move back to copies began meanwhile, it may have passed this follower already: take
        the row back (unless rewritten since, by a new move up) and say no."""
        audience = self._repos.audience
        if (await audience.mode(subject)).state not in (GROWING, MERGED):
            return False
        if not await self._feed.merge(follower, subject):
            return False
        etag = await audience.merge_etag(follower, subject)
        if (await audience.mode(subject)).state in (GROWING, MERGED):
            return True
        if etag is not None:
            await audience.remove_merge(follower, subject, etag)
        return False

    async def unfollowed(self, message: Unfollowed) -> Outcome:
        """Purge the subject's posts from the follower's timeline, now and once more later.

        If the follower follows again by then, only copies of deleted posts are removed: a
        delete's own passes skip readers who did not follow at that moment, so this is where
        a copy that landed late in such a reader's timeline goes."""
        follower, subject = message.follower, message.subject
        follows = self._repos.follows
        if not await follows.is_following(follower, subject):
            await self._feed.unmerge_if_unfollowed(follower, subject)
            if message.confirm:
                wait = await self._unquiet_for(follower, subject)
                if wait > 0:  # unfollowed again lately: purge once the pair is quiet
                    return Continue(message, delay_s=wait)
                await self._feed.purge(follower, subject)
            elif not await self._purge_deferred(follower, subject):
                await self._feed.purge(follower, subject)
        else:  # unfollowed, then followed again (or, rarely, never made: then this is cheap)
            await self._feed.reconcile(follower, subject)
        if message.confirm:
            return DONE
        await follows.sync_index(follower, subject)
        await queue_regrade_if_due(self._repos, self._ctx.hybrid, subject)
        sweep = message.model_copy(update={"confirm": True})
        return Continue(sweep, delay_s=self._ctx.timing.sweep_delay_s)
