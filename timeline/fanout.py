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
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from timeline.entities import Post
from timeline.keys import now_ticks, post_id_ticks, post_row_key
from timeline.messages import FanoutMessage, Followed, PostCreated, PostDeleted, Unfollowed
from timeline.placement import hash64
from timeline.repositories import Repositories, request_id
from timeline.storage import Storage
from timeline.writer import PartitionWriter, Tracker

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
    ) -> None:
        self._repos = repositories
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
    ) -> FanoutProcessor:
        return cls(
            Repositories.on(storage),
            writer,
            follower_page_size=follower_page_size,
            timing=timing,
            timeline_cap=timeline_cap,
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

    async def deliver(self, message: PostCreated) -> Outcome:
        """Write the post into one page of followers' timelines (and the author's own)."""
        async with self._admission(self._expected_page_rows()) as deadline:
            post = await self._arrived_post(message)
            if post is None:
                return await self._missing_post(message)
            page = await self._repos.follows.follower_ids_page(
                post.author, self._page_size, message.cursor
            )
            owners = page.items if message.cursor is not None else [post.author, *page.items]
            self._page_rows += (len(owners) - self._page_rows) / 16
            written = await self._put(owners, post, deadline)
        await written.wait()
        await self._undo_lost_reasons(post, owners, page.items)
        await self._trim([owner for owner in owners if self._trim_due(owner, post.post_id)])
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        return DONE

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
        page = await self._repos.follows.follower_ids_page(author, self._page_size, message.cursor)
        await self._remove(page.items if message.cursor else [author, *page.items], post_id)
        if page.continuation is not None:
            return Continue(message.model_copy(update={"cursor": page.continuation}))
        if not message.confirm:
            sweep = message.model_copy(update={"cursor": None, "confirm": True})
            return Continue(sweep, delay_s=self._timing.sweep_delay_s)
        return DONE

    async def backfill(self, message: Followed) -> Outcome:
        """Copy the subject's newest posts into the follower's timeline; undo what lost its
        reason by the time the copies landed."""
        follower, subject = message.follower, message.subject
        follows = self._repos.follows
        async with self._admission(BACKFILL_POSTS) as deadline:
            if not await follows.is_following(follower, subject):
                if self._young(message.requested):
                    return Defer("the follow is not stored yet")
                if await self._abandoned(message) or not await follows.is_following(
                    follower, subject
                ):
                    await follows.sync_index(follower, subject)
                    return DONE  # never made, or unfollowed since (its passes remove copies)
            else:
                await self._abandoned(message)  # made by another request: this one never lands
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
        await follows.sync_index(follower, subject)
        return DONE

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
        sweep = message.model_copy(update={"confirm": True})
        return Continue(sweep, delay_s=self._timing.sweep_delay_s)

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
