"""Live home timelines: what a stream sends next, found by polling storage.

Azure Storage has no change feed for tables, so a stream reads its timeline every poll with
a newer-than read (one query for a reader who merges no large author). A position is a row
key, which orders entries by when their posts were *made*, but entries *land* in that order
only roughly: a post lands in each timeline after the worker fans it out, so one made a
moment before the newest entry sent can land after it. So each poll re-reads a look-back
window below the newest entry sent, and skips the entries this stream already sent (it
remembers those of the window). An entry that lands more than the window late is not
streamed (the next read of the first page shows it); fan-out lag is about a second, the
window is 120 s by default.

A stream that resumes from a position (``Last-Event-ID``) does not know which entries of the
window its client already has, so it sends them again: a client dedupes by ``post_id``.
Deletes are not streamed; the next page read shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from timeline.errors import RetryableError
from timeline.model.entities import Post
from timeline.model.keys import MAX_TICKS
from timeline.reads.home import HomeTimeline, Position
from timeline.tables.rows import META

log = logging.getLogger(__name__)
PAGE = 250
TICKS_PER_SECOND = 10_000_000


@dataclass(frozen=True, slots=True)
class StreamTiming:
    poll_s: float
    lookback_s: float
    heartbeat_s: float


class TimelineWatch:
    """The entries of one home timeline that a stream has not sent yet, oldest first."""

    def __init__(
        self, home: HomeTimeline, owner: str, *, lookback_s: float, max_entries: int
    ) -> None:
        self._home = home
        self._owner = owner
        self._max_entries = max_entries
        self._lookback = int(lookback_s * TICKS_PER_SECOND)
        self._newest: str | None = None
        self._sent: dict[str, str] = {}
        """Post id to row key of each entry sent that the next poll re-reads."""

    def start_after(self, row_key: str | None) -> None:
        """Send entries newer than ``row_key`` (None: every entry the timeline gets)."""
        self._newest = row_key

    async def skip_present(self) -> None:
        """Remember the window's entries as sent: a stream with no position starts now."""
        await self.fresh()

    async def fresh(self) -> list[Post]:
        """The window's entries not sent yet, oldest first; they count as sent from now."""
        bound = META if self._newest is None else _older_by(self._newest, self._lookback)
        entries = await self._newer_than(bound)
        fresh = [post for post in entries if post.post_id not in self._sent]
        if entries and (self._newest is None or entries[0].row_key < self._newest):
            self._newest = entries[0].row_key
        for post in fresh:
            self._sent[post.post_id] = post.row_key
        if self._newest is not None:
            window = _older_by(self._newest, self._lookback)
            self._sent = {post: key for post, key in self._sent.items() if key < window}
        return fresh[::-1]

    async def _newer_than(self, until: str) -> list[Post]:
        """The entries newer than ``until``, newest first, at most ``max_entries`` (a stream
        resumed from long ago gets the newest, as a capped timeline would show them): one
        page read per 250."""
        entries: list[Post] = []
        position: Position | None = Position(until=until)
        while position is not None and len(entries) < self._max_entries:
            wanted = min(PAGE, self._max_entries - len(entries))
            page, position = await self._home.page(self._owner, wanted, position)
            entries += page
        return entries

    async def updates(
        self, timing: StreamTiming, stopping: asyncio.Event
    ) -> AsyncIterator[list[Post]]:
        """Each poll's fresh entries, and an empty list whenever a heartbeat is due; ends
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


def _older_by(row_key: str, ticks: int) -> str:
    """The row-key bound ``ticks`` older than ``row_key``'s post (greater keys are older)."""
    reversed_ticks = min(int(row_key[:19]) + ticks, MAX_TICKS)
    return f"{reversed_ticks:019d}~"
