"""Live home timelines: what a stream sends next, found by polling what *landed* in storage.

Each poll reads, per source, the rows written since its cursor (``timeline.reads.landed``:
``Timestamp ge @since``): the reader's own timeline partition, and the ``posts`` partition
of each large author it merges. An idle poll is one request per source, whatever the
sources hold; a busy one reads only what landed (and the few seconds of overlap).

What a source's new rows mean:

- a post row (the reader's copy, or a merged author's post): a ``post`` event, unless this
  stream sent that post already (a redelivered copy rewrites its row), or it was removed
  (see below), or it landed more than the look-back after it was made (a follow's backfill
  of old posts: the next page read shows those in their place). So an entry landing late, by
  up to the look-back, is always sent, however many landed with it;
- a removal trace (``timeline.tables.traces``: a delete, an unfollow's purge): a ``delete``
  event with the post id. A post removed before this stream read it is never sent, only its
  delete (a client ignores a delete of a post it does not show);
- a merge row (the reader started merging an author): that author becomes a source from the
  row's ``Timestamp`` on.

A merged author's posts count only while the reader follows it: a poll that brings posts of
merged authors checks that once (one query, never on an idle poll), and an author no longer
followed stops being a source. A reader's own copies of an author it merges are skipped,
as page reads skip them.

A stream that starts without a position sends what lands from now (the rows that landed in
the last look-back are read once, as already sent). One that resumes from a position
(``Last-Event-ID`` or ``since``) first sends, by page reads, the entries newer than the
position's look-back window (at most ``max_entries``: a capped timeline's worth), then reads
what landed in the last look-back and sends what it did not send yet: a client dedupes by
``post_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from azure.data.tables import TableEntity

from timeline.errors import RetryableError
from timeline.model.entities import POST_SELECT, Post
from timeline.model.keys import MAX_TICKS, post_id_from_row_key, post_id_ticks, ticks_to_datetime
from timeline.reads.home import HomeTimeline, Position
from timeline.reads.landed import OVERLAP_S, Landed, landed_at
from timeline.storage.names import POSTS, TIMELINES
from timeline.tables.audience import FIRST_POST_KEY, AudienceRepository, merge_row_author
from timeline.tables.follows import FollowsRepository
from timeline.tables.rows import META
from timeline.tables.traces import traced_row

log = logging.getLogger(__name__)
PAGE = 250
TICKS_PER_SECOND = 10_000_000
_SELECT = [*POST_SELECT, "void"]


@dataclass(frozen=True, slots=True)
class StreamTiming:
    poll_s: float
    lookback_s: float
    heartbeat_s: float
    token_recheck_s: float = 30.0
    """How often an open stream checks again that its token is not revoked."""


@dataclass(frozen=True, slots=True)
class Removal:
    """A post that left the timeline (deleted, or purged by an unfollow)."""

    post_id: str


Update = Post | Removal


class TimelineWatch:
    """The updates of one home timeline that a stream has not sent yet, oldest first."""

    def __init__(
        self, home: HomeTimeline, owner: str, *, lookback_s: float, max_entries: int
    ) -> None:
        self._home = home
        self._storage = home.storage
        self._follows = FollowsRepository(home.storage)
        self._owner = owner
        self._max_entries = max_entries
        self._lookback = timedelta(seconds=lookback_s)
        self._sources: dict[str, Landed] = {}
        """The reader's partition (key ``""``) and each merged author's (key: the author)."""
        self._sent: dict[str, datetime] = {}
        """Post id to creation time of each post sent or removed that may still land."""
        self._removed: set[str] = set()
        self._backlog: list[Update] = []

    async def open(self, since: str | None) -> None:
        """Start from the row key ``since`` (None: from now): set up the sources and read
        once what landed in the last look-back."""
        start = datetime.now(UTC) - self._lookback - timedelta(seconds=OVERLAP_S)
        self._sources[""] = Landed(TIMELINES, self._owner, start, _SELECT)
        authors = await AudienceRepository(self._storage).merged_authors(self._owner)
        for author in await self._follows.following_among(self._owner, authors):
            self._sources[author] = Landed(POSTS, author, start, _SELECT)
        if since is None:
            present = await self._poll()  # read as sent; only its removals are sent
            self._backlog = [update for update in present if isinstance(update, Removal)]
            return
        caught_up = await self._newer_than(_older_by(since, self._lookback))
        self._remember(caught_up)
        self._backlog = [*caught_up, *await self._poll()]

    async def fresh(self) -> list[Update]:
        """What landed in every source since the last poll and is not sent yet, oldest
        first (posts, then removals); it counts as sent from now."""
        backlog, self._backlog = self._backlog, []
        return [*backlog, *await self._poll()]

    async def _poll(self) -> list[Update]:
        sources = list(self._sources.items())
        found = await asyncio.gather(*(source.new_rows(self._storage) for _, source in sources))
        removals: list[Update] = []
        posts: list[Post] = []
        authors: set[str] = set()
        for (key, _), rows in zip(sources, found, strict=True):
            for row in rows:
                update = self._meaning(key, row)
                if isinstance(update, Removal):
                    removals.append(update)
                elif update is not None:
                    posts.append(update)
                    authors.update([key] if key else [])
        posts = await self._still_followed(posts, authors)
        self._remember(removals)
        fresh_posts = self._unsent(posts)
        self._remember(fresh_posts)
        return [*sorted(fresh_posts, key=lambda post: post.row_key, reverse=True), *removals]

    def _meaning(self, source: str, row: TableEntity) -> Post | Removal | None:
        """A source row as a post to send, a removal, or nothing (and merge rows met)."""
        key: str = row["RowKey"]
        removed = traced_row(key)
        if removed is not None:
            return Removal(post_id_from_row_key(removed))
        author = merge_row_author(key)
        if author is not None and not source:
            self._sources.setdefault(
                author, Landed(POSTS, author, landed_at(row) - self._lookback, _SELECT)
            )
        if not FIRST_POST_KEY <= key < META or row.get("void"):
            return None
        post = Post.from_entity(row)
        if not source and post.author in self._sources:
            return None  # merged: its posts come from its own partition
        made = ticks_to_datetime(post_id_ticks(post.post_id))
        late = landed_at(row) - made > self._lookback + timedelta(seconds=OVERLAP_S)
        return None if late else post

    async def _still_followed(self, posts: list[Post], authors: set[str]) -> list[Post]:
        """Drop merged authors' posts (and sources) of authors the reader left: one query,
        only when such posts came."""
        if not authors:
            return posts
        following = await self._follows.following_among(self._owner, authors)
        for gone in authors - following:
            self._sources.pop(gone, None)
        return [post for post in posts if post.author in following or post.author not in authors]

    def _unsent(self, posts: list[Post]) -> list[Post]:
        unique = {post.post_id: post for post in posts}
        return [
            post
            for post_id, post in unique.items()
            if post_id not in self._sent and post_id not in self._removed
        ]

    def _remember(self, updates: Sequence[Update]) -> None:
        """Note what was sent; forget what can no longer land in time to be sent."""
        for update in updates:
            if isinstance(update, Removal):
                self._removed.add(update.post_id)
            made = ticks_to_datetime(post_id_ticks(update.post_id))
            self._sent[update.post_id] = made
        oldest = min(source.since for source in self._sources.values())
        horizon = oldest - self._lookback - timedelta(seconds=OVERLAP_S)
        self._sent = {post: made for post, made in self._sent.items() if made >= horizon}
        self._removed &= self._sent.keys()

    async def _newer_than(self, until: str) -> list[Post]:
        """The entries newer than ``until``, oldest first, at most ``max_entries`` (a stream
        resumed from long ago gets the newest, as a capped timeline would show them): one
        page read per 250."""
        entries: list[Post] = []
        position: Position | None = Position(until=until)
        while position is not None and len(entries) < self._max_entries:
            wanted = min(PAGE, self._max_entries - len(entries))
            page, position = await self._home.page(self._owner, wanted, position)
            entries += page
        return entries[::-1]

    async def updates(
        self, timing: StreamTiming, stopping: asyncio.Event
    ) -> AsyncIterator[list[Update]]:
        """Each poll's fresh updates, and an empty list whenever a heartbeat is due; ends
        when ``stopping`` is set. A storage outage skips polls, it does not end the stream."""
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while not stopping.is_set():
            try:
                fresh = await self.fresh()
            except RetryableError as error:
                log.warning("stream of %s skipped a poll: %s", self._owner, error)
                fresh = []
            if fresh or loop.time() - quiet_since >= timing.heartbeat_s:
                quiet_since = loop.time()
                yield fresh
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timing.poll_s)


def _older_by(row_key: str, by: timedelta) -> str:
    """The row-key bound ``by`` older than ``row_key``'s post (greater keys are older)."""
    ticks = round(by.total_seconds() * TICKS_PER_SECOND)
    reversed_ticks = min(int(row_key[:19]) + ticks, MAX_TICKS)
    return f"{reversed_ticks:019d}~"
