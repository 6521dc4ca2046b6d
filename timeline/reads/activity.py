"""What a read tells storage: the reader is active (the stamp), and, if it was dormant, that
its timeline must come back (the wake).

Both are decided from the head rows the home read's first query returns anyway
(``timeline.tables.activity``): the stamp is written only when the stored one is older than
the current period (at most one write per reader per period, a day at most), and a wake is
queued only by a read that finds the marker still ``dormant`` (then moved to ``waking``), or
``waking`` for longer than a wake takes (a lost message, or a crashed worker's).
"""

from __future__ import annotations

import logging
import time

from azure.core.exceptions import HttpResponseError

from timeline.errors import StorageUnavailableError
from timeline.model.messages import Wake
from timeline.storage.queue import MessageSender
from timeline.tables.activity import (
    DORMANT,
    STATE,
    WAKE_AT,
    ActivityRepository,
    Head,
    Inactivity,
)

log = logging.getLogger(__name__)


class Attendance:
    """Stamps activity and queues wakes, from the head rows a read has already fetched."""

    def __init__(
        self,
        activity: ActivityRepository,
        queue: MessageSender,
        inactivity: Inactivity,
        *,
        resend_after_s: float,
    ) -> None:
        self._activity = activity
        self._queue = queue
        self._inactivity = inactivity
        self._resend_after_s = resend_after_s

    @property
    def every_s(self) -> float:
        """One stamp period: a stream's polls touch that often (inf when disabled)."""
        return self._inactivity.granularity_s if self._inactivity.enabled else float("inf")

    async def touch(self, reader: str) -> None:
        """Activity without a home read (a stream opens): read the head rows, then ``seen``."""
        try:
            head = await self._activity.head(reader)
        except (StorageUnavailableError, HttpResponseError) as error:
            log.warning("reading %s's activity failed: %s", reader, error)
            return
        await self.seen(reader, head)

    async def registered(self, reader: str) -> None:
        """A new user counts as active from registration (the dormancy check filed before
        the stamp is written), so one who never reads goes dormant; a failure is logged (the
        user then counts as active until its first read)."""
        if not self._inactivity.enabled:
            return
        try:
            await self._activity.stamp(
                reader, self._inactivity.stamp(), self._inactivity, first=True
            )
        except (StorageUnavailableError, HttpResponseError) as error:
            log.warning("stamping new user %s failed: %s", reader, error)

    async def seen(self, reader: str, head: Head) -> None:
        """Stamp if the stored stamp is old, and wake a dormant reader; a failure is logged
        (the read it follows succeeded; the next read tries again)."""
        try:
            if self._inactivity.enabled:
                await self._activity.stamp_if_old(reader, head, self._inactivity)
            await self._wake(reader, head)
        except (StorageUnavailableError, HttpResponseError) as error:
            log.warning("recording %s's activity failed: %s", reader, error)

    async def _wake(self, reader: str, head: Head) -> None:
        """Queue the wake (before the marker changes, like every API write), then mark the
        marker ``waking``: reads after that one do not queue it again."""
        marker = head.marker
        if marker is None:
            return
        stale = time.time() - float(marker.get(WAKE_AT) or 0) > self._resend_after_s
        if marker.get(STATE) != DORMANT and not stale:
            return
        await self._queue.send(Wake(reader=reader, generation=head.generation))
        await self._activity.mark_waking(reader, marker)
