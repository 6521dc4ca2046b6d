"""Live home timelines: what a stream sends next, found by polling what *landed* in storage.

Each poll reads, per source, the rows written since its cursor (``timeline.reads.landed``:
``Timestamp ge @since``): the reader's own timeline partition, and the ``posts`` partition
of each large author it merges. An idle poll is one request per source, whatever the
sources hold; a busy one reads only what landed (and the few seconds of overlap).

What a source's new rows mean:

- a post row (the reader's copy, or a merged author's post): a ``post`` event, unless this
  stream sent that post already (a redelivered copy rewrites its row), or its removal landed
  after this row (see below), or it landed more than the look-back after it was made (a
  follow's backfill of old posts: the next page read shows those in their place). So an
  entry landing late, by up to the look-back, is always sent, however many landed with it;
- a removal trace (``timeline.tables.traces``: a delete, an unfollow's purge): a ``delete``
  event with the post id. A post removed before this stream read it is never sent, only its
  delete (a client ignores a delete of a post it does not show). Removals suppress by when
  they landed: a copy landing after the removal (a re-follow's backfill) is sent again;
- a merge row (the reader started merging an author): that author becomes a source from the
  row's ``Timestamp`` on; its trace (the merge ended): the follow is checked.

A poll's rows are applied in landing order. A merged author's posts count only while the
reader follows it: a poll that brings posts of merged authors, or a merge row's trace,
checks that once (one query, never on an idle poll); an author no longer followed stops
being a source, and the stream sends a ``delete`` for each of its posts it sent. A reader's
own copies of an author it merges are skipped, as page reads skip them. A poll reads every
source and checks follows before it changes anything, so a failed request loses nothing.

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
import time
from collections.abc import AsyncIterator, Set
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from azure.data.tables import TableEntity

from timeline.errors import RetryableError
from timeline.model.entities import POST_SELECT, Post
from timeline.model.keys import (
    MAX_TICKS,
    TICKS_PER_SECOND,
    post_id_from_row_key,
    post_id_ticks,
    ticks_to_datetime,
)
from timeline.reads.hidden import exclusive_members
from timeline.reads.home import HomeTimeline, Position
from timeline.reads.landed import OVERLAP_S, Landed, Reading, landed_at
from timeline.reads.private import unseen_authors
from timeline.storage.names import POSTS, TIMELINES
from timeline.tables.activity import MARKER_ROW
from timeline.tables.audience import AudienceRepository, merge_row_author
from timeline.tables.follows import FollowsRepository
from timeline.tables.relations import RelationsRepository
from timeline.tables.rows import FIRST_POST_KEY, META
from timeline.tables.traces import traced_row

log = logging.getLogger(__name__)
PAGE = 250


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


@dataclass(slots=True)
class _Seen:
    """The last thing this stream sent about a post: present or removed, landed when."""

    landed: datetime
    present: bool
    source: str
    made: datetime


@dataclass(slots=True)
class _Found:
    """One poll's reads, not yet acted on."""

    items: list[tuple[datetime, str, Update]]
    """(landing time, source, post or removal), in landing order."""
    merged: dict[str, datetime]
    """Authors whose merge row landed, with when."""
    unmerged: set[str]
    """Authors whose merge row went."""
    marker: bool = False
    """The reader's dormancy marker landed (a sweep judged it inactive): the stream wakes it."""


class TimelineWatch:
    """The updates of one home timeline that a stream has not sent yet, oldest first."""

    def __init__(
        self, home: HomeTimeline, owner: str, *, lookback_s: float, max_entries: int
    ) -> None:
        self._home = home
        self._storage = home.storage
        self._follows = FollowsRepository(home.storage)
        self._relations = RelationsRepository(home.storage)
        self._owner = owner
        self._max_entries = max_entries
        self._lookback = timedelta(seconds=lookback_s)
        self._sources: dict[str, Landed] = {}
        """The reader's partition (key ``""``) and each merged author's (key: the author)."""
        self._seen: dict[str, _Seen] = {}
        """Post id to what was last sent of each post that may still land."""
        self._backlog: list[Update] = []
        self._touch_due = time.monotonic() + home.touch_every_s
        """When a poll next counts as activity (``HomeTimeline.touch``): once per stamp
        period, and at once after a poll saw the marker land."""

    async def open(self, since: str | None) -> None:
        """Start from the row key ``since`` (None: from now): set up the sources and read
        once what landed in the last look-back."""
        start = datetime.now(UTC) - self._lookback - timedelta(seconds=OVERLAP_S)
        self._sources[""] = Landed(TIMELINES, self._owner, start, POST_SELECT)
        authors = await AudienceRepository(self._storage).merged_authors(self._owner)
        for author in await self._follows.following_among(self._owner, authors):
            self._sources[author] = Landed(POSTS, author, start, POST_SELECT)
        if since is None:
            present = await self._poll()  # read as sent; only its removals are sent
            self._backlog = [update for update in present if isinstance(update, Removal)]
            return
        caught_up = await self._newer_than(_older_by(since, self._lookback))
        for post in caught_up:
            self._seen[post.post_id] = _Seen(_EARLIEST, True, "", _made(post.post_id))
        self._backlog = [*caught_up, *await self._poll()]

    async def fresh(self) -> list[Update]:
        """What landed in every source since the last poll and is not sent yet, oldest
        first (posts, then removals); it counts as sent from now. A poll that fails
        changes nothing: the backlog and every source's cursor stay for the next."""
        self._backlog = [*self._backlog, *await self._poll()]
        fresh = await self._visible(self._backlog)  # if it fails, the backlog keeps them
        self._backlog = []
        if time.monotonic() >= self._touch_due:
            self._touch_due = time.monotonic() + self._home.touch_every_s
            await self._home.touch(self._owner)  # failures are logged, never raised
        return fresh

    async def _visible(self, updates: list[Update]) -> list[Update]:
        """Without the posts the reader's blocks, mutes and filters hide, nor followers-only
        posts of authors it no longer follows, nor its exclusive lists' members' entries,
        read when there are posts (one query, and one per exclusive list; an idle poll
        spends none)."""
        if not any(isinstance(update, Post) for update in updates):
            return updates
        posts = [update for update in updates if isinstance(update, Post)]
        (hidden, _), unseen = await asyncio.gather(
            self._relations.hidden(self._owner),
            unseen_authors(self._follows, self._owner, [post.to_entity("") for post in posts]),
        )
        excluded: frozenset[str] = frozenset()
        if hidden.exclusive_lists:
            excluded, _ = await exclusive_members(
                self._follows, self._owner, hidden.exclusive_lists
            )
        return [
            update
            for update in updates
            if not isinstance(update, Post)
            or not (
                hidden.hides(update.author, update.reposted_by, update.text)
                or (update.followers_only and update.author in unseen)
                or (update.reposted_by or update.author) in excluded
            )
        ]

    async def _poll(self) -> list[Update]:
        """Read every source and check follows first; change state only once all succeeded."""
        sources = list(self._sources.values())
        readings = await asyncio.gather(*(source.new_rows(self._storage) for source in sources))
        found = self._found(list(zip(self._sources, readings, strict=True)))
        asked = {key for _, key, update in found.items if key and isinstance(update, Post)}
        asked |= found.unmerged
        following = await self._follows.following_among(self._owner, asked) if asked else set()
        for source, reading in zip(sources, readings, strict=True):
            source.commit(reading)
        for author, landed in found.merged.items():
            self._sources.setdefault(
                author, Landed(POSTS, author, landed - self._lookback, POST_SELECT)
            )
        out: dict[str, Update] = {}
        for landed, key, update in found.items:
            if not (isinstance(update, Post) and key in asked - following):
                self._note(landed, key, update, out)
        for gone in asked - following:
            self._drop(gone, out)
        for gone in found.unmerged:
            self._sources.pop(gone, None)
        if found.marker:
            self._touch_due = 0.0
        self._forget()
        posts = [update for update in out.values() if isinstance(update, Post)]
        removals = [update for update in out.values() if isinstance(update, Removal)]
        return [*sorted(posts, key=lambda post: post.row_key, reverse=True), *removals]

    def _found(self, readings: list[tuple[str, Reading]]) -> _Found:
        """The meaning of one poll's fresh rows, merge rows first (they say which of the
        reader's own copies come from a merged author's partition instead)."""
        found = _Found([], {}, set())
        own = [row for key, reading in readings if not key for row in reading.fresh]
        for row in own:
            key = row["RowKey"]
            added, removed = merge_row_author(key), merge_row_author(traced_row(key) or "")
            if added is not None:
                found.merged[added] = landed_at(row)
            if removed is not None:
                found.unmerged.add(removed)
            found.marker |= key == MARKER_ROW
        merged = self._sources.keys() | found.merged.keys()
        for source, reading in readings:
            for row in reading.fresh:
                update = self._meaning(source, row, merged)
                if update is not None:
                    found.items.append((landed_at(row), source, update))
        found.items.sort(key=lambda item: item[0])
        return found

    def _meaning(self, source: str, row: TableEntity, merged: Set[str]) -> Update | None:
        """A source row as a post to send, a removal, or nothing."""
        key: str = row["RowKey"]
        removed = traced_row(key)
        if removed is not None:
            is_post = FIRST_POST_KEY <= removed < META
            return Removal(post_id_from_row_key(removed)) if is_post else None
        if not FIRST_POST_KEY <= key < META:
            return None
        post = Post.from_entity(row)
        if not source and post.author in merged and post.reposted_by is None:
            return None  # merged: its posts come from its own partition (not its reposts)
        late = landed_at(row) - _made(post.post_id) > self._lookback + timedelta(seconds=OVERLAP_S)
        return None if late else post

    def _note(self, landed: datetime, source: str, update: Update, out: dict[str, Update]) -> None:
        """Apply one landed row: a removal wins over what landed before it, a copy over a
        removal only if it landed after it (a re-follow's backfill), never a duplicate."""
        seen = self._seen.get(update.post_id)
        present = isinstance(update, Post)
        if seen is not None and (landed <= seen.landed or (present and seen.present)):
            return
        self._seen[update.post_id] = _Seen(landed, present, source, _made(update.post_id))
        out[update.post_id] = update

    def _drop(self, author: str, out: dict[str, Update]) -> None:
        """The reader left a merged author: it is no source, and what it sent is removed."""
        self._sources.pop(author, None)
        for post_id, seen in self._seen.items():
            if seen.source == author and seen.present:
                seen.present = False
                out[post_id] = Removal(post_id)

    def _forget(self) -> None:
        """Forget posts made too long ago to land in time to be sent."""
        oldest = min(source.since for source in self._sources.values())
        horizon = oldest - self._lookback - timedelta(seconds=OVERLAP_S)
        self._seen = {post: seen for post, seen in self._seen.items() if seen.made >= horizon}

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


def _made(post_id: str) -> datetime:
    return ticks_to_datetime(post_id_ticks(post_id))


_EARLIEST = datetime.min.replace(tzinfo=UTC)


def _older_by(row_key: str, by: timedelta) -> str:
    """The row-key bound ``by`` older than ``row_key``'s post (greater keys are older)."""
    ticks = round(by.total_seconds() * TICKS_PER_SECOND)
    reversed_ticks = min(int(row_key[:19]) + ticks, MAX_TICKS)
    return f"{reversed_ticks:019d}~"
