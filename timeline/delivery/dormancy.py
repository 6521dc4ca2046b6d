"""Readers who are gone get no copies: dormancy starts in the expiry sweep and ends in a wake.

Start (``Dormancy.check``, the sweep of a reader's due dormancy check): if the stamp moved
on, file the next check; else write the marker (conditional on the stamp as read, so a read
that stamped meanwhile wins), then mark each followed author's follow row ``inactive``. Every
mark is sent within ``flag_window_s`` of reading the marker as ``dormant``; what the window
does not cover is left to the next sweep (the check stays filed).

End (``Waking.wake``, queued by the first read that finds the marker): move the marker to
``waking`` (from then on no sweep marks anything), unmark every follow row and copy each
followed author's newest posts in (``Feed.copy_newest``, race-free with deletes, unfollows,
hybrid authors and the cap); ``sweep_delay_s`` later (past any mark sent within the window
of an earlier read of ``dormant``) do it again, file the next check and delete the marker.
Until then reads merge every followed author from ``posts`` (``timeline.reads.home``).
docs/guarantees.md ("Inactive readers") walks through each interleaving.
"""

from __future__ import annotations

import asyncio
import logging
import time

from timeline.delivery.context import Context
from timeline.delivery.feed import Feed
from timeline.delivery.outcomes import DONE, Continue, Outcome
from timeline.model.messages import Wake
from timeline.storage.accounts import Storage
from timeline.tables.activity import DORMANT, STATE, ActivityRepository, Inactivity

log = logging.getLogger(__name__)
_AT_ONCE = 16
_NOTE_EVERY = 8
"""Chunks between two writes of the wake's progress (128 subjects)."""


class Dormancy:
    """The sweep's side: judge a due dormancy check from storage, and start dormancy."""

    def __init__(self, storage: Storage, inactivity: Inactivity, *, flag_window_s: float) -> None:
        self._storage = storage
        self._activity = ActivityRepository(storage)
        self._inactivity = inactivity
        self._window_s = flag_window_s

    async def check(self, reader: str, now: float) -> bool:
        """Settle one due check; False leaves it filed for the next sweep (marks unfinished)."""
        head = await self._activity.head(reader)
        if head.stamp is None:
            return True  # never stamped (or gone): nothing to judge
        due = self._inactivity.due(head.stamp)
        if not self._inactivity.enabled or due > now:
            if self._inactivity.enabled and not head.dormant:
                await self._activity.file_check(reader, due)
            return True  # active (a wake files the check itself when it ends)
        if head.marker is None:
            if not await self._activity.start_dormancy(reader, head):
                return False  # stamped meanwhile: judge again next round
            head = await self._activity.head(reader)
        if head.marker is None or head.marker.get(STATE) != DORMANT:
            return True  # waking: the reader is back
        flagged = await self._flag_all(reader, head.generation)
        await self._undo_if_woken(reader, head.generation)
        return flagged

    async def _undo_if_woken(self, reader: str, generation: str) -> None:
        """After the marks ended: if the marker is no longer this dormancy's ``dormant``, a
        wake may have unmarked before a mark of ours landed (however late it was sent), so
        clear every mark of this generation ourselves. A marker still ``dormant`` read after
        every mark ended means they all landed before ``waking``: the wake's passes clear them."""
        head = await self._activity.head(reader)
        marker = head.marker
        if marker is not None and head.generation == generation and marker.get(STATE) == DORMANT:
            return
        async for subjects in self._activity.ever_followed(reader):
            for start in range(0, len(subjects), _AT_ONCE):
                chunk = subjects[start : start + _AT_ONCE]
                await asyncio.gather(
                    *(self._activity.unflag(s, reader, generation=generation) for s in chunk)
                )

    async def _flag_all(self, reader: str, generation: str) -> bool:
        """Mark every followed author's follow row, each sent within the window of the
        marker read; False if the window ran out first."""
        not_after = time.monotonic() + self._window_s
        async for subjects in self._activity.ever_followed(reader):
            for start in range(0, len(subjects), _AT_ONCE):
                if time.monotonic() > not_after:
                    return False
                chunk = subjects[start : start + _AT_ONCE]
                await asyncio.gather(
                    *(
                        self._activity.flag(subject, reader, generation, not_after=not_after)
                        for subject in chunk
                    )
                )
        return True


class Waking:
    """The worker's side: a ``Wake`` brings a dormant reader's timeline back, in two passes."""

    def __init__(self, context: Context, feed: Feed, inactivity: Inactivity) -> None:
        self._ctx = context
        self._feed = feed
        self._activity = context.repos.activity
        self._inactivity = inactivity

    async def wake(self, message: Wake) -> Outcome:
        head = await self._activity.head(message.reader)
        if head.marker is None or head.generation != message.generation:
            return DONE  # woken already, or a wake of an older dormancy
        if head.marker.get(STATE) == DORMANT:
            await self._activity.mark_waking(message.reader, head.marker)
            return Continue(message)  # read the marker again: now (or by another) waking
        since = head.since - self._inactivity.granularity_s if head.since else 0.0
        noted = message.generation if message.confirm else None
        await self._restore(message.reader, since, noted)
        if not message.confirm:
            again = message.model_copy(update={"confirm": True})
            return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
        stamp = head.stamp if head.stamp is not None else self._inactivity.stamp()
        if self._inactivity.enabled:
            await self._activity.file_check(message.reader, self._inactivity.due(stamp))
        await self._activity.end_dormancy(message.reader, message.generation)
        return DONE

    async def _restore(self, reader: str, since: float, noted: str | None) -> None:
        """Unmark every follow row the index names, and copy in each author's posts made
        ``since`` that the partition lacks (only those can have been skipped); with
        ``noted`` (the second pass: no late mark can follow it), record the progress every
        ``_NOTE_EVERY`` subjects, so dormant pages merge only authors not restored yet."""
        async for subjects in self._activity.ever_followed(reader):
            for start in range(0, len(subjects), _AT_ONCE):
                chunk = subjects[start : start + _AT_ONCE]
                await asyncio.gather(
                    *(self._restore_one(reader, subject, since) for subject in chunk)
                )
                last = start + len(chunk) >= len(subjects)
                if noted is not None and (last or (start // _AT_ONCE + 1) % _NOTE_EVERY == 0):
                    await self._activity.note_restored(reader, noted, chunk[-1])

    async def _restore_one(self, reader: str, subject: str, since: float) -> None:
        await self._activity.unflag(subject, reader)
        await self._feed.copy_newest(reader, subject, missing_only=True, since=since)
