"""The one owner of a reader's timeline: every row the handlers write into it or take out of
it goes through ``Feed``, in pairs with symmetric names.

A handler decides what a timeline should hold; ``Feed`` holds the writes that make it so, and
the steps among them that race other handlers say so in their docstrings ("race-sensitive"),
with the read-then-check order that makes them correct.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace

from timeline.delivery.batching.tracker import Tracker
from timeline.delivery.context import Context
from timeline.errors import contention
from timeline.model.entities import DETACHED, Post
from timeline.model.keys import TICKS_PER_SECOND, now_ticks, post_id_ticks, post_row_key
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage.placement import hash64
from timeline.tables.audience import MERGED
from timeline.tables.follows import REPOSTS
from timeline.tables.timelines import CopyRow

log = logging.getLogger(__name__)

BACKFILL_POSTS = 250
"""A follow backfills one page: the newest posts (and reposts) a reader sees first."""
DEDUPE_WINDOW = 40
"""Mastodon's ``REBLOG_FALLOFF``: how many newest entries a repost's copy looks through."""
REPOST_BACKFILL_S = 7 * 24 * 3600
"""A follow's backfill takes the followee's reposts of posts made in the last 7 days: its
repost rows are ordered by their originals, so this bounds what the backfill reads."""
TRIM_SLACK_SHARE = 16
"""A timeline is trimmed about once per ``cap / 16`` deliveries to it (50 for 800), so it
holds at most about 1/16 more than the cap between trims."""


class Feed:
    """Readers' timelines: a post pushed to (or unpushed from) many; an author's newest posts
    copied into (or purged from) one; a merge row given (or taken back) for an author merged
    at read time; and the trim that keeps each near its cap."""

    def __init__(self, context: Context, *, timeline_cap: int = 0) -> None:
        self._ctx = context
        self._repos = context.repos
        self._writer = context.writer
        self._cap = timeline_cap
        self._trim_every = max(1, timeline_cap // TRIM_SLACK_SHARE)

    async def push(self, owners: Iterable[str], post: Post, deadline: float) -> Tracker:
        """Add the copies to the writer; the tracker says when they are written."""
        tracker = Tracker()
        created, row_key, properties = post_id_ticks(post.post_id), post.row_key, post.properties()
        for owner in owners:
            await self._writer.upsert(
                owner, row_key, properties, tracker, deadline=deadline, created_ticks=created
            )
        return tracker

    async def unpush(self, owners: Iterable[str], post_id: str) -> None:
        tracker = Tracker()
        row_key = post_row_key(post_id)
        for owner in owners:
            await self._writer.delete(owner, row_key, tracker)
        await tracker.wait()

    async def unpush_if_unfollowed(self, owner: str, followee: str, row_key: str) -> None:
        """Race-sensitive: read the copy, then the follow; delete the copy only if unchanged
        since that read, so a re-follow's backfill that rewrote it in between is kept. A copy
        changed otherwise (marked: ``timeline.delivery.replies``) is read and decided again."""
        timelines = self._repos.timelines
        for _ in range(ETAG_ATTEMPTS):
            etag = await timelines.etag_of(owner, row_key)
            if etag is None or await self._repos.follows.is_following(owner, followee):
                return
            if await timelines.remove_unchanged(owner, [(row_key, etag)]):
                return
        raise contention(f"the timeline of {owner}")

    async def sweep_traces(self, owners: Iterable[str]) -> None:
        """Remove the expired removal traces of each timeline (one query each, bounded)."""
        await asyncio.gather(*(self._repos.timelines.sweep_traces(owner) for owner in owners))

    async def push_rows(self, owner: str, posts: Iterable[Post], deadline: float) -> Tracker:
        tracker = Tracker()
        for post in posts:
            await self._writer.upsert(
                owner, post.row_key, post.properties(), tracker, deadline=deadline
            )
        return tracker

    async def unpush_rows(self, owner: str, row_keys: Iterable[str]) -> None:
        tracker = Tracker()
        for row_key in row_keys:
            await self._writer.delete(owner, row_key, tracker)
        await tracker.wait()

    async def copy_newest(
        self,
        follower: str,
        subject: str,
        *,
        missing_only: bool = False,
        since: float = 0.0,
        reposts: bool = False,
    ) -> None:
        """Copy the subject's newest posts into the follower's timeline (``missing_only``:
        those it lacks; ``since``: only posts made from then on, epoch seconds; ``reposts``:
        with its reposts, unless the follow hides them); undo what lost its reason by the
        time the copies landed.
        Race-sensitive: the follow and mode are read inside the admission, so the copies are
        written within the deadline of that read. Rewriting every copy is what makes a purge
        that read them before this follow keep them (their etags change); a copy not
        rewritten (``missing_only``) relies on the follow's second pass instead."""
        follows, audience = self._repos.follows, self._repos.audience
        async with self._ctx.admission(BACKFILL_POSTS) as deadline:
            follow, mode, overflow = await asyncio.gather(
                follows.follow_row(follower, subject),
                audience.mode(subject),
                audience.copy_etag(subject, follower),
            )
            if follow is None:
                return  # read again inside the deadline: the copies' reason must be this fresh
            if mode.state == MERGED and overflow is None:
                return  # it merges the subject (a copy of a post made since could outlive
                # the post: its delete sweeps only overflow readers)
            posts = await self._repos.posts.newest(subject, BACKFILL_POSTS)
            posts = [post for post in posts if post.created_at.timestamp() >= since]
            window = now_ticks() - REPOST_BACKFILL_S * TICKS_PER_SECOND
            found: list[tuple[str, str, str]] = []
            if reposts and follow.get(REPOSTS) is not False:
                found = await self._repos.reposts.live_reposts(subject, window)
                posts, found = _one_page(posts, found)
            posts = await self._shown_replies(follower, subject, posts)
            shared = await self._shared(follower, subject, posts, found)
            if not posts and not shared:
                return
            held = await self._held(follower, subject) if missing_only else set()
            fresh = [post for post in (*posts, *shared) if post.row_key not in held]
            written = await self.push_rows(follower, fresh, deadline)
        await written.wait()
        follow = await follows.follow_row(follower, subject)
        if follow is not None:
            surviving = await self._repos.posts.surviving(subject, posts)
            gone = [post.row_key for post in posts if post.post_id not in surviving]
            gone += await self._lost(subject, shared, window, follow.get(REPOSTS) is not False)
            await self.unpush_rows(follower, gone)
        elif not missing_only:
            await self.purge(follower, subject)  # else the unfollow's passes purge, once quiet
        await self.trim([follower])

    async def _shown_replies(self, follower: str, subject: str, posts: list[Post]) -> list[Post]:
        """Without the replies to authors the follower does not follow (Mastodon's rule, as
        a post's delivery applies it; nor those to a deleted account): one query per 14
        replied-to authors."""
        posts = [p for p in posts if p.reply_author != DETACHED]
        targets = {p.reply_author for p in posts if p.reply_author not in (None, subject, follower)}
        if not targets:
            return posts
        followed = await self._repos.follows.following_among(follower, targets)
        return [p for p in posts if p.reply_author not in targets or p.reply_author in followed]

    async def _shared(
        self, follower: str, subject: str, posts: list[Post], found: list[tuple[str, str, str]]
    ) -> list[Post]:
        """The copies of the subject's reposts ``found``, without those of a followers-only
        or deleted original, nor of a post that ``posts`` or the follower's newest
        ``DEDUPE_WINDOW`` entries (but the subject's reposts) show: a point read per repost,
        one query of the follower's timeline."""
        if not found:
            return []
        originals, shown = await asyncio.gather(
            asyncio.gather(*(self._repos.posts.get(a, post_id) for _, a, post_id in found)),
            self._repos.timelines.newest_shown(follower, DEDUPE_WINDOW, subject),
        )
        shown.update(post.post_id for post in posts)
        return [
            replace(original, post_id=repost_id, reposted_by=subject, original=original.post_id)
            for (repost_id, _, _), original in zip(found, originals, strict=True)
            if original is not None
            and not original.followers_only
            and original.post_id not in shown
        ]

    async def _lost(
        self, subject: str, copies: list[Post], window: int, shows_reposts: bool
    ) -> list[str]:
        """Row keys of the repost copies whose repost is undone now (a deleted original's
        reposts are voided by its delete's first pass), or all of them once the follow hides
        the subject's reposts: one query per 1,000 repost rows in the window."""
        if not copies or not shows_reposts:
            return [copy.row_key for copy in copies]
        live = {repost[0] for repost in await self._repos.reposts.live_reposts(subject, window)}
        return [copy.row_key for copy in copies if copy.post_id not in live]

    async def _held(self, follower: str, subject: str) -> set[str]:
        """Row keys of the subject's copies (its reposts' too) in the follower's timeline."""
        held: set[str] = set()
        async for rows in self._repos.timelines.rows_by_author(follower, subject, reposts=True):
            held.update(row.key for row in rows)
        return held

    async def purge(self, follower: str, subject: str) -> None:
        """Remove the subject's copies from the follower's timeline, unless followed again.

        Race-sensitive: each page is read (with etags) before the follow is checked, and
        deleted only where unchanged: a re-follow before the read is seen by the check; a
        backfill after the read changed the etag. Either way the re-follow's copies stay (then
        only copies of deleted posts go). A row changed or gone since its read is read and
        decided again: the whole walk is made again until one removes every row it finds (a
        copy may also change by being marked, ``timeline.delivery.replies``)."""
        timelines, follows = self._repos.timelines, self._repos.follows
        for _ in range(ETAG_ATTEMPTS):
            settled = True
            async for rows in timelines.rows_by_author(follower, subject, reposts=True):
                if await follows.is_following(follower, subject):
                    await self.reconcile(follower, subject)
                    return
                pairs = [(row.key, row.etag) for row in rows]
                settled &= await timelines.remove_unchanged(follower, pairs) == len(pairs)
            if settled:
                return
        raise contention(f"the timeline of {follower}")

    async def reconcile(self, follower: str, subject: str) -> None:
        """Remove the follower's copies of the subject's posts that no longer exist, and of
        its reposts no longer live (the repost rows of the copies' originals, read after the
        page: a copy in it was written after its repost was stored); and mark the copies of
        replies whose reply now answers a deleted account, as a reply's own passes do
        (``timeline.delivery.replies``: they walk only the readers following then)."""
        async for rows in self._repos.timelines.rows_by_author(follower, subject, reposts=True):
            keys = [row.key for row in rows]
            posts = await self._repos.posts.live_row_keys(subject, keys)
            alive = set(posts)
            originals = sorted({row.original for row in rows if row.original})
            if originals:
                reposts = await self._repos.reposts.live_reposts(
                    subject, post_id_ticks(originals[0]), originals[-1]
                )
                alive.update(post_row_key(repost_id) for repost_id, _, _ in reposts)
            await self.unpush_rows(follower, [key for key in keys if key not in alive])
            kept = [row for row in rows if row.key in alive]
            await self._mark_detached(follower, kept, posts)

    async def _mark_detached(
        self, follower: str, rows: list[CopyRow], posts: dict[str, str]
    ) -> None:
        """Mark the copies among ``rows`` of replies that answer a deleted account: those
        of the subject's posts by what the posts' rows say (``posts``, read already), those
        of its reposts by the answered users' tombstones (one point read per user)."""
        replies = [row for row in rows if row.answers not in ("", DETACHED)]
        marked = [row.key for row in replies if posts.get(row.key) == DETACHED]
        shared = [row for row in replies if row.original]
        users = sorted({row.answers for row in shared})
        deleted = await asyncio.gather(*(self._repos.users.deleted(user) for user in users))
        gone = {user for user, is_gone in zip(users, deleted, strict=True) if is_gone}
        marked += [row.key for row in shared if row.answers in gone]
        for key in marked:
            await self._repos.timelines.detach_reply([follower], key)

    async def merge(self, follower: str, subject: str) -> bool:
        """Give the follower a merge row for the subject, or, when its merge rows are full,
        make it an overflow reader (then False: it needs copies). A row whose follow is gone
        by the time it is written is taken back."""
        audience = self._repos.audience
        merged = await audience.add_merge(follower, subject, self._ctx.hybrid.max_merged)
        if not merged:
            await audience.add_copy(subject, follower)
        await self.unmerge_if_unfollowed(follower, subject)
        return merged

    async def merge_page(self, followers: list[str], subject: str) -> None:
        """``merge`` for a page of followers, with one follow check for the page (after every
        row is written) instead of one each."""
        audience, max_merged = self._repos.audience, self._ctx.hybrid.max_merged

        async def give(follower: str) -> None:
            if not await audience.add_merge(follower, subject, max_merged):
                await audience.add_copy(subject, follower)

        await asyncio.gather(*(give(follower) for follower in followers))
        if followers:
            still = await self._repos.follows.followers_between(
                subject, followers[0], followers[-1]
            )
            gone = [follower for follower in followers if follower not in still]
            await asyncio.gather(*(self.unmerge_if_unfollowed(f, subject) for f in gone))

    async def unmerge_if_unfollowed(self, follower: str, subject: str) -> None:
        """Race-sensitive: read the merge and overflow rows, then the follow; remove them only
        if unchanged since that read, so a re-follow's handler that rewrote them in between
        keeps them."""
        audience = self._repos.audience
        merge, copy = await asyncio.gather(
            audience.merge_etag(follower, subject), audience.copy_etag(subject, follower)
        )
        if (merge or copy) and not await self._repos.follows.is_following(follower, subject):
            if merge is not None:
                await audience.remove_merge(follower, subject, merge)
            if copy is not None:
                await audience.remove_copy(subject, follower, copy)

    def trim_due(self, owner: str, post_id: str) -> bool:
        """One delivery in ``cap / TRIM_SLACK_SHARE`` trims its timeline, chosen by a hash so
        that a redelivered page trims the same timelines: a query per that many deliveries,
        and a timeline outgrows the cap by about that many entries between trims."""
        return bool(self._cap) and hash64(f"{owner}/{post_id}") % self._trim_every == 0

    async def trim(self, owners: list[str]) -> None:
        """Trim these timelines together; housekeeping, so a failure is logged, never the
        outcome of the message whose writes have all landed (the next trim catches up)."""
        if not self._cap or not owners:
            return
        results = await asyncio.gather(
            *(self._repos.timelines.trim(owner, self._cap) for owner in owners),
            return_exceptions=True,
        )
        failed = [result for result in results if isinstance(result, BaseException)]
        if failed:
            log.warning("%d of %d timeline trims failed: %r", len(failed), len(owners), failed[0])


def _one_page(
    posts: list[Post], reposts: list[tuple[str, str, str]]
) -> tuple[list[Post], list[tuple[str, str, str]]]:
    """The posts and reposts among the newest ``BACKFILL_POSTS`` of both (by id: when each
    was made), counted before any is left out, so the page has no gap."""
    if not reposts:
        return posts, reposts
    newest = sorted([*(post.post_id for post in posts), *(r[0] for r in reposts)], reverse=True)
    last = newest[BACKFILL_POSTS - 1] if len(newest) >= BACKFILL_POSTS else ""
    return [p for p in posts if p.post_id >= last], [r for r in reposts if r[0] >= last]
