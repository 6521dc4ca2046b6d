"""Readers who are gone get no copies: dormancy starts in the expiry sweep and ends in a wake.

Start (``Dormancy.check``, the sweep of a reader's due dormancy check): if the stamp moved
on, file the next check; if a wake is under way, file one at the next stamp period (the
wake files its check before it deletes the marker: a sweep in between must not drop the
reader's only check, or the reader would never be judged again); else write the marker
(conditional on the stamp as read, so a read that stamped meanwhile wins), then mark each
followed author's follow row ``inactive`` for posts made from the marker's ``since``.
Each row is read before the marker is read as ``dormant`` and marked only if unchanged
since, so a mark cannot land after a wake's unmark.

End (``Waking.wake``, queued by the first read that finds the marker): move the marker to
``waking`` (from then on no sweep marks anything), unmark every follow row (a write each
time) and copy in each followed author's posts made from ``since`` that the partition lacks
(``Feed.copy_newest``, race-free with deletes, unfollows, hybrid authors and the cap): the
marks skip exactly those posts. ``sweep_delay_s`` later do it again (for follow rows the
index named late), file the next check and delete the marker.
Until then reads merge the followed authors not yet restored from ``posts``
(``timeline.reads.home``).
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
from timeline.tables.activity import DORMANT, FLAG, STATE, ActivityRepository, Inactivity

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
        if not self._inactivity.enabled:
            return False  # kept for when it is turned on again (the sweep skips checks then)
        due = self._inactivity.due(head.stamp)
        if due > now:  # waking too: the wake's own check may be this one
            await self._activity.file_check(reader, due)
            return True  # active
        if head.marker is None:
            if not await self._activity.start_dormancy(reader, head):
                return False  # stamped meanwhile: judge again next round
            head = await self._activity.head(reader)
        if head.marker is not None and head.marker.get(STATE) != DORMANT:
            await self._activity.file_check(reader, self._next_period(now))
            return True  # waking: judged again a stamp period on, once the wake has ended
        return head.marker is None or await self._flag_all(reader, head.generation)

    @property
    def enabled(self) -> bool:
        return self._inactivity.enabled

    def _next_period(self, now: float) -> float:
        """The next stamp period's start: sweeps that re-file one check file it once."""
        granularity = self._inactivity.granularity_s
        return (now // granularity + 1) * granularity

    async def _flag_all(self, reader: str, generation: str) -> bool:
        """Mark every followed author's follow row: each row read before the marker is read
        as this dormancy's ``dormant``, then marked only if unchanged since (so a wake that
        began meanwhile wins: its unmark always writes). Each mark is sent within the window
        of that read; False if the window ran out or a row changed first (the next sweep
        goes on)."""
        not_after = time.monotonic() + self._window_s
        complete = True
        async for subjects in self._activity.ever_followed(reader):
            for start in range(0, len(subjects), _AT_ONCE):
                if time.monotonic() > not_after:
                    return False
                chunk = subjects[start : start + _AT_ONCE]
                rows = await asyncio.gather(
                    *(self._activity.follow_row(subject, reader) for subject in chunk)
                )
                head = await self._activity.head(reader)  # after the rows: see flag()
                marker = head.marker
                if marker is None or head.generation != generation or marker.get(STATE) != DORMANT:
                    return True  # waking or woken: the wake unmarks whatever landed
                marks = [
                    self._activity.flag(
                        subject, reader, row, generation, head.since, not_after=not_after
                    )
                    for subject, row in zip(chunk, rows, strict=True)
                    if row is not None and row.get(FLAG) != generation
                ]
                complete = all(await asyncio.gather(*marks)) and complete
        return complete


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
        since = head.since  # the marks skip posts made from then on: copy exactly those
        noted = message.generation if message.confirm else None
        await self._restore(message.reader, since, noted)
        if not message.confirm:
            again = message.model_copy(update={"confirm": True})
            return Continue(again, delay_s=self._ctx.timing.sweep_delay_s)
        if self._inactivity.enabled:
            stamp = head.stamp if head.stamp is not None else self._inactivity.stamp()
            await self._activity.file_check(message.reader, self._inactivity.due(stamp))
        else:  # kept for when it is turned on again (sweeps with it off skip checks)
            await self._activity.file_check(message.reader, time.time())
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
