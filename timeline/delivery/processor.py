"""What the fan-out worker does with each message, and why the end state is always right.

Every decision is taken from storage: a copy is written only after reading that its post
exists and (for followers) that the follow exists, and it must be sent within
``write_deadline_s`` of that read or not at all (``PartitionWriter`` drops it). Undo happens
twice: at once, by re-checking after the write (the common race, fixed in milliseconds), and
for good by a second pass of every delete and unfollow that runs ``sweep_delay_s`` later,
after any write that read the old state has landed or been dropped. The full argument, one
interleaving at a time, is in the README ("Why it is correct").

A post or delete covers one page of followers per lease; the message's cursor is advanced in
place (the worker rewrites the message), so a redelivered page never forks the chain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from timeline.model.entities import Page, Post
from timeline.model.keys import now_ticks, post_id_ticks, post_row_key
from timeline.model.messages import (
    FanoutMessage,
    Followed,
    PostCreated,
    PostDeleted,
    Regrade,
    Unfollowed,
)
from timeline.storage.accounts import Storage
from timeline.storage.placement import hash64
from timeline.storage.queue import MessageSender
from timeline.storage.tracker import Tracker
from timeline.storage.writer import PartitionWriter
from timeline.tables.audience import COPIED, GROWING, MERGED, SHRINKING, AuthorMode
from timeline.tables.repositories import Repositories, request_id

log = logging.getLogger(__name__)

BACKFILL_POSTS = 250
"""A follow backfills one page: the newest posts a reader sees first."""
TRIM_SLACK_SHARE = 16
"""A timeline is trimmed about once per ``cap / 16`` deliveries to it (50 for 800), so it
holds at most about 1/16 more than the cap between trims."""
ADMISSION_SHARE = 0.5
"""New work starts only while the writer's backlog drains within this share of the write
deadline: deep enough for big batches, shallow enough that writes meet their deadline."""
_TICKS_PER_SECOND = 10_000_000
_ARRIVAL_POLLS = (0.05, 0.1, 0.2)
"""Short in-process waits for a row the API is writing right after it queued the message."""


@dataclass(frozen=True, slots=True)
class Hybrid:
    """When authors are merged at read time instead of copied (``timeline.tables.audience``)."""

    threshold: int = 0
    """Followers from which an author is merged; below half of it, copied again (0: never
    merged)."""
    max_merged: int = 20
    """Merge rows a reader may hold; past them it gets copies."""
    queue: MessageSender | None = None
    """Where a crossing sends its ``Regrade``."""

    def merge_due(self, mode: AuthorMode, followers: int) -> bool:
        return mode.state == COPIED and bool(self.threshold) and followers >= self.threshold

    def copy_due(self, mode: AuthorMode, followers: int) -> bool:
        return mode.state == MERGED and (not self.threshold or 2 * followers < self.threshold)


@dataclass(frozen=True, slots=True)
class Timing:
    """The time bounds the protocol rests on (see the README for how they relate)."""

    write_deadline_s: float = 300.0
    """A copy is sent within this long of the reads that justified it, or never."""
    sweep_delay_s: float = 335.0
    """When the second pass of a delete or unfollow runs: past the write deadline plus the
    longest a sent write can take (the storage timeout), with margin."""
    arrival_window_s: float = 30.0
    """How long after the API queued a message its own storage write may still arrive."""


@dataclass(frozen=True, slots=True)
class Done:
    """Everything this message asked for is done: delete it."""


@dataclass(frozen=True, slots=True)
class Continue:
    """Rewrite the message as ``message`` and let it come back after ``delay_s``."""

    message: FanoutMessage
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Defer:
    """Not yet: the state this message acts on has not arrived; retry with backoff."""

    reason: str


Outcome = Done | Continue | Defer
DONE = Done()


class FanoutProcessor:
    def __init__(
        self,
        repositories: Repositories,
        writer: PartitionWriter,
        *,
        follower_page_size: int = 1000,
        timing: Timing | None = None,
        timeline_cap: int = 0,
        hybrid: Hybrid | None = None,
    ) -> None:
        self._repos = repositories
        self._hybrid = hybrid or Hybrid()
        self._writer = writer
        self._page_size = follower_page_size
        self._cap = timeline_cap
        self._trim_every = max(1, timeline_cap // TRIM_SLACK_SHARE)
        self._timing = timing or Timing()
        self._page_rows = 100.0
        """A moving average of rows per delivered page, for admission."""

    @classmethod
    def on(
        cls,
        storage: Storage,
        writer: PartitionWriter,
        *,
        follower_page_size: int = 1000,
        timing: Timing | None = None,
        timeline_cap: int = 0,
        hybrid: Hybrid | None = None,
    ) -> FanoutProcessor:
        return cls(
            Repositories.on(storage),
            writer,
            follower_page_size=follower_page_size,
            timing=timing,
            timeline_cap=timeline_cap,
            hybrid=hybrid,
        )

    async def handle(self, message: FanoutMessage) -> Outcome:
        match message:
            case PostCreated():
                return await self.deliver(message)
            case PostDeleted():
                return await self.retract(message)
            case Followed():
                return await self.backfill(message)
            case Unfollowed():
                return await self.unfollowed(message)
            case Regrade():
                return await self.regrade(message)

    async def deliver(self, message: PostCreated) -> Outcome:
        """Write the post into one page of followers' timelines (and the author's own)."""
        async with self._admission(self._expected_page_rows()) as deadline:
            post = await self._arrived_post(message)
            if post is None:
                return await self._missing_post(message)
            merged = message.merged
            if message.cursor is None:
                merged = not (await self._repos.audience.mode(post.author)).copies_to_followers
            page = await self._readers_page(post.author, merged, message.cursor)
            owners = page.items if message.cursor is not None else [post.author, *page.items]
            self._page_rows += (len(owners) - self._page_rows) / 16
            written = await self._put(owners, post, deadline)
        await written.wait()
        await self._undo_lost_reasons(post, owners, page.items)
        await self._trim([owner for owner in owners if self._trim_due(owner, post.post_id)])
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        return DONE

    async def _readers_page(
        self, author: str, merged: bool, cursor: dict[str, str] | None
    ) -> Page[str]:
        """A page of those who may hold copies of the author's posts: every follower, or
        only the overflow readers of a merged author."""
        if merged:
            return await self._repos.audience.copy_readers_page(author, self._page_size, cursor)
        return await self._repos.follows.follower_ids_page(author, self._page_size, cursor)

    async def _arrived_post(self, message: PostCreated) -> Post | None:
        """The post; the API queues the message before it stores the post, so wait briefly."""
        post = await self._repos.posts.get(message.author, message.post_id)
        for pause in _ARRIVAL_POLLS:
            if post is not None or message.cursor is not None or not self._young_post(message):
                break
            await asyncio.sleep(pause)
            post = await self._repos.posts.get(message.author, message.post_id)
        return post

    async def _missing_post(self, message: PostCreated) -> Outcome:
        """No post: not stored yet, deleted, or never stored (then claim its id as void)."""
        if message.cursor is None and self._young_post(message):
            return Defer("the post is not stored yet")
        if message.cursor is None and not await self._repos.posts.void(
            message.author, message.post_id
        ):
            return Defer("the post was stored just now")
        return DONE  # gone: its delete's passes remove every copy

    async def _undo_lost_reasons(self, post: Post, owners: list[str], followers: list[str]) -> None:
        """Re-check after writing: undo copies whose follow or post disappeared meanwhile."""
        if followers:
            still = await self._repos.follows.followers_between(
                post.author, followers[0], followers[-1]
            )
            for follower in followers:
                if follower not in still:
                    await self._unput_if_unfollowed(follower, post)
        if await self._repos.posts.get(post.author, post.post_id) is None:
            await self._remove(owners, post.post_id)

    async def _unput_if_unfollowed(self, owner: str, post: Post) -> None:
        """Read the copy, then the follow; delete the copy only if unchanged since that read,
        so a re-follow's backfill that rewrote it in between is kept."""
        etag = await self._repos.timelines.etag_of(owner, post.row_key)
        if etag is not None and not await self._repos.follows.is_following(owner, post.author):
            await self._repos.timelines.remove_unchanged(owner, [(post.row_key, etag)])

    async def retract(self, message: PostDeleted) -> Outcome:
        """Delete the source row first (so deliveries see it gone), then the copies, page by
        page; then once more after ``sweep_delay_s`` for copies that landed late."""
        author, post_id = message.author, message.post_id
        if message.cursor is None and not message.confirm:
            await self._repos.posts.delete(author, post_id)
        merged = message.merged
        if message.cursor is None:
            merged = self._never_copied(await self._repos.audience.mode(author), post_id)
        page = await self._readers_page(author, merged, message.cursor)
        await self._remove(page.items if message.cursor else [author, *page.items], post_id)
        if page.continuation is not None:
            update = {"cursor": page.continuation, "merged": merged}
            return Continue(message.model_copy(update=update))
        if not message.confirm:
            sweep = message.model_copy(update={"cursor": None, "confirm": True, "merged": False})
            return Continue(sweep, delay_s=self._timing.sweep_delay_s)
        return DONE

    def _never_copied(self, mode: AuthorMode, post_id: str) -> bool:
        """No follower but overflow readers can hold a copy: the author has been merged since
        before the post was made (by more than any delivery's write deadline and clock skew:
        every delivery of it read the author merged)."""
        margin = round(self._timing.sweep_delay_s * _TICKS_PER_SECOND)
        return mode.state == MERGED and post_id_ticks(post_id) > mode.since + margin

    async def backfill(self, message: Followed) -> Outcome:
        """Copy the subject's newest posts into the follower's timeline; undo what lost its
        reason by the time the copies landed."""
        follower, subject = message.follower, message.subject
        follows = self._repos.follows
        if not await follows.is_following(follower, subject):
            if self._young(message.requested):
                return Defer("the follow is not stored yet")
            if await self._abandoned(message) or not await follows.is_following(follower, subject):
                await follows.sync_index(follower, subject)
                return DONE  # never made, or unfollowed since (its passes remove copies)
        else:
            await self._abandoned(message)  # made by another request: this one never lands
        if not await self._merge_for(follower, subject):
            await self._copy_newest(follower, subject)
        await follows.sync_index(follower, subject)
        await self._regrade_if_due(subject)
        return DONE

    async def _merge_for(self, follower: str, subject: str) -> bool:
        """True if the subject is merged at read time and the follower got a merge row. If a
        move back to copies began meanwhile, it may have passed this follower already: take
        the row back (unless rewritten since, by a new move up) and say no."""
        audience = self._repos.audience
        if (await audience.mode(subject)).state not in (GROWING, MERGED):
            return False
        if not await self._give_merge_row(follower, subject):
            return False
        etag = await audience.merge_etag(follower, subject)
        if (await audience.mode(subject)).state in (GROWING, MERGED):
            return True
        if etag is not None:
            await audience.remove_merge(follower, subject, etag)
        return False

    async def _give_merge_row(self, follower: str, subject: str) -> bool:
        """Give the follower a merge row for the subject, or, when its merge rows are full,
        make it an overflow reader (then False: it needs copies). A row whose follow is gone
        by the time it is written is taken back."""
        audience = self._repos.audience
        merged = await audience.add_merge(follower, subject, self._hybrid.max_merged)
        if not merged:
            await audience.add_copy(subject, follower)
        await self._unmerge_if_unfollowed(follower, subject)
        return merged

    async def _give_merge_rows(self, followers: list[str], subject: str) -> None:
        """``_give_merge_row`` for a page of followers, with one follow check for the page
        (after every row is written) instead of one each."""
        audience, max_merged = self._repos.audience, self._hybrid.max_merged

        async def give(follower: str) -> None:
            if not await audience.add_merge(follower, subject, max_merged):
                await audience.add_copy(subject, follower)

        await asyncio.gather(*(give(follower) for follower in followers))
        if followers:
            still = await self._repos.follows.followers_between(
                subject, followers[0], followers[-1]
            )
            gone = [follower for follower in followers if follower not in still]
            await asyncio.gather(*(self._unmerge_if_unfollowed(f, subject) for f in gone))

    async def _unmerge_if_unfollowed(self, follower: str, subject: str) -> None:
        """Read the merge and overflow rows, then the follow; remove them only if unchanged
        since that read, so a re-follow's handler that rewrote them in between keeps them."""
        audience = self._repos.audience
        merge, copy = await asyncio.gather(
            audience.merge_etag(follower, subject), audience.copy_etag(subject, follower)
        )
        if (merge or copy) and not await self._repos.follows.is_following(follower, subject):
            if merge is not None:
                await audience.remove_merge(follower, subject, merge)
            if copy is not None:
                await audience.remove_copy(subject, follower, copy)

    async def _copy_newest(self, follower: str, subject: str) -> None:
        """Copy the subject's newest posts into the follower's timeline; undo what lost its
        reason by the time the copies landed."""
        follows, audience = self._repos.follows, self._repos.audience
        async with self._admission(BACKFILL_POSTS) as deadline:
            following, mode, overflow = await asyncio.gather(
                follows.is_following(follower, subject),
                audience.mode(subject),
                audience.copy_etag(subject, follower),
            )
            if not following:
                return  # read again inside the deadline: the copies' reason must be this fresh
            if mode.state == MERGED and overflow is None:
                return  # it merges the subject (a copy of a post made since could outlive
                # the post: its delete sweeps only overflow readers)
            posts = await self._repos.posts.newest(subject, BACKFILL_POSTS)
            written = await self._put_rows(follower, posts, deadline)
        await written.wait()
        if await follows.is_following(follower, subject):
            surviving = await self._repos.posts.surviving(subject, posts)
            gone = [post.row_key for post in posts if post.post_id not in surviving]
            await self._remove_rows(follower, gone)
        else:
            await self.purge(follower, subject)
        await self._trim([follower])

    def _trim_due(self, owner: str, post_id: str) -> bool:
        """One delivery in ``cap / TRIM_SLACK_SHARE`` trims its timeline, chosen by a hash so
        that a redelivered page trims the same timelines: a query per that many deliveries,
        and a timeline outgrows the cap by about that many entries between trims."""
        return bool(self._cap) and hash64(f"{owner}/{post_id}") % self._trim_every == 0

    async def _trim(self, owners: list[str]) -> None:
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

    async def unfollowed(self, message: Unfollowed) -> Outcome:
        """Purge the subject's posts from the follower's timeline, now and once more later.

        If the follower follows again by then, only copies of deleted posts are removed: a
        delete's own passes skip readers who did not follow at that moment, so this is where
        a copy that landed late in such a reader's timeline goes."""
        follower, subject = message.follower, message.subject
        follows = self._repos.follows
        if not await follows.is_following(follower, subject):
            if not message.confirm:
                await self._abandoned(message)  # made by another request: this one never lands
            await self._unmerge_if_unfollowed(follower, subject)
            await self.purge(follower, subject)
        elif message.confirm:
            await self.reconcile(follower, subject)
        elif self._young(message.requested):
            return Defer("the unfollow is not stored yet")
        elif await self._abandoned(message):
            await follows.sync_index(follower, subject)
            return DONE  # the unfollow was never made
        else:
            await self.reconcile(follower, subject)  # unfollowed, then followed again
        if message.confirm:
            return DONE
        await follows.sync_index(follower, subject)
        await self._regrade_if_due(subject)
        sweep = message.model_copy(update={"confirm": True})
        return Continue(sweep, delay_s=self._timing.sweep_delay_s)

    async def _regrade_if_due(self, author: str) -> None:
        await queue_regrade_if_due(self._repos, self._hybrid, author)

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
            return Continue(fenced, delay_s=self._timing.sweep_delay_s)
        page = await self._repos.follows.follower_ids_page(author, self._page_size, message.cursor)
        if not await self._owns(message):
            return DONE  # a stale copy of this page: the move ended without it
        if message.merge:
            await self._give_merge_rows(page.items, author)
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
                await self._regrade_if_due(author)  # crossed back while it moved
        return DONE

    async def _still_due(self, author: str, mode: AuthorMode, message: Regrade) -> bool:
        followers = await self._repos.follows.follower_count(author)
        hybrid = self._hybrid
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
        await self._copy_newest(follower, author)
        await self.reconcile(follower, author)
        if merge is not None:
            await audience.remove_merge(follower, author, merge)
        if copy is not None:
            await audience.remove_copy(author, follower, copy)

    async def _abandoned(self, message: Followed | Unfollowed) -> bool:
        """Give up waiting for the API's write: claim its request, so it can never land."""
        request = request_id(message.follower, message.requested)
        return await self._repos.follows.claim(message.subject, request)

    async def purge(self, follower: str, subject: str) -> None:
        """Remove the subject's copies from the follower's timeline, unless followed again.

        Each page is read (with etags) before the follow is checked, and deleted only where
        unchanged: a re-follow before the read is seen by the check; a backfill after the read
        changed the etag. Either way the re-follow's copies stay (then only copies of deleted
        posts go)."""
        timelines, follows = self._repos.timelines, self._repos.follows
        async for rows in timelines.rows_by_author(follower, subject):
            if await follows.is_following(follower, subject):
                await self.reconcile(follower, subject)
                return
            await timelines.remove_unchanged(follower, rows)

    async def reconcile(self, follower: str, subject: str) -> None:
        """Remove the follower's copies of the subject's posts that no longer exist."""
        async for rows in self._repos.timelines.rows_by_author(follower, subject):
            keys = [key for key, _ in rows]
            alive = await self._repos.posts.live_row_keys(subject, keys)
            await self._remove_rows(follower, [key for key in keys if key not in alive])

    def _expected_page_rows(self) -> int:
        """What to hold room for while a page is read: twice the recent average page (a page
        reserved at its maximum would crowd real rows out of the backlog and shrink batches)."""
        return max(1, min(self._page_size + 1, round(2 * self._page_rows)))

    @contextlib.asynccontextmanager
    async def _admission(self, rows: int) -> AsyncIterator[float]:
        """Wait until the writer's backlog is short, reserve room for ``rows``, and start the
        clock: yields the deadline of writes justified by reads made from now on."""
        async with self._writer.admission(self._timing.write_deadline_s * ADMISSION_SHARE, rows):
            yield asyncio.get_running_loop().time() + self._timing.write_deadline_s

    def _young(self, requested_ticks: int) -> bool:
        window = self._timing.arrival_window_s * _TICKS_PER_SECOND
        return now_ticks() - requested_ticks < window

    def _young_post(self, message: PostCreated) -> bool:
        return self._young(post_id_ticks(message.post_id))

    async def _put(self, owners: Iterable[str], post: Post, deadline: float) -> Tracker:
        """Add the copies to the writer; the tracker says when they are written."""
        tracker = Tracker()
        created, row_key, properties = post_id_ticks(post.post_id), post.row_key, post.properties()
        for owner in owners:
            await self._writer.upsert(
                owner, row_key, properties, tracker, deadline=deadline, created_ticks=created
            )
        return tracker

    async def _put_rows(self, owner: str, posts: Iterable[Post], deadline: float) -> Tracker:
        tracker = Tracker()
        for post in posts:
            await self._writer.upsert(
                owner, post.row_key, post.properties(), tracker, deadline=deadline
            )
        return tracker

    async def _remove(self, owners: Iterable[str], post_id: str) -> None:
        tracker = Tracker()
        row_key = post_row_key(post_id)
        for owner in owners:
            await self._writer.delete(owner, row_key, tracker)
        await tracker.wait()

    async def _remove_rows(self, owner: str, row_keys: Iterable[str]) -> None:
        tracker = Tracker()
        for row_key in row_keys:
            await self._writer.delete(owner, row_key, tracker)
        await tracker.wait()


async def queue_regrade_if_due(repositories: Repositories, hybrid: Hybrid, author: str) -> bool:
    """Send a ``Regrade`` when the author's follower count has crossed the threshold (up) or
    half of it (down); True if one was sent. It is sent before anything changes, and it
    changes the mode only if still due, so a lost or duplicated send is harmless: the next
    follow or unfollow sends again, a duplicate finds the move taken."""
    if hybrid.queue is None:
        return False
    mode, followers = await asyncio.gather(
        repositories.audience.mode(author), repositories.follows.follower_count(author)
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
