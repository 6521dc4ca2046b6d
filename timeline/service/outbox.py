"""Write, then release: how an API write and its fan-out message stay together.

The message is *reserved* first: sent hidden for ``hidden_s`` (``Reserving.reserve``). Then
the write is made, every storage call of it sent within ``write_deadline_s`` of the start
(``timeline.storage.flow.guard.deadline``), or refused. Only after the write succeeded is the
message *released* (made visible). So the worker never sees a message before its fact, and
a message whose release was lost (the process died, the call failed) shows up by itself
once hidden: its fact is stored by then, or never will be, because ``hidden_s`` exceeds the
deadline plus a storage call plus the 30 s Azure may still work on a call its client gave up
(docs/guarantees.md, "Why it is correct")."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from azure.core.exceptions import HttpResponseError

from timeline.errors import StorageUnavailableError
from timeline.model.messages import FanoutMessage
from timeline.storage.flow.guard import deadline
from timeline.storage.queue import Reservation, Reserving

log = logging.getLogger(__name__)

WRITE_DEADLINE_S = 25.0
HIDDEN_S = 60
"""The defaults of ``Settings`` with its default storage timeout (5 s)."""
RELEASE_RETRY_PAUSES_S = (0.2, 1.0, 3.0)
"""Pauses between a failed release and the next try (in the background: no client waits),
each drawn from half to one and a half times these, so retries after one stall spread."""
DRAIN_S = 2.0
"""How long a stopping API waits for releases still running: what is left then shows when
its hidden time ends (a delay, never a loss), so a storage stall cannot hold a shutdown
past its grace period."""


class Outbox:
    """Reserves an API write's message, bounds the write in time, and releases the message."""

    def __init__(
        self,
        queue: Reserving,
        *,
        write_deadline_s: float = WRITE_DEADLINE_S,
        hidden_s: int = HIDDEN_S,
    ) -> None:
        self.queue = queue
        self._write_deadline_s = write_deadline_s
        self._hidden_s = hidden_s
        self._releasing: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def written(self, message: FanoutMessage) -> AsyncIterator[None]:
        """Reserve ``message``, run the body (the write) under the deadline, and release the
        message once the body has succeeded. A body that fails releases nothing: its write
        may still land, and then its message shows up when hidden time ends.

        The release runs beside the answer (it is one more queue call the client need not
        wait for), started outside the deadline's scope: a task started inside it would
        inherit the deadline. ``drain`` waits for releases still running."""
        started = time.monotonic()
        reservation = await self.queue.reserve(message, self._hidden_s)
        with deadline(started + self._write_deadline_s):
            yield
        task = asyncio.create_task(self._release(reservation))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def drain(self, within_s: float = DRAIN_S) -> None:
        """Wait up to ``within_s`` for the releases still running, then cancel the rest (on
        shutdown; their messages show when hidden time ends)."""
        if not self._releasing:
            return
        _, pending = await asyncio.wait(set(self._releasing), timeout=within_s)
        for task in pending:
            task.cancel()
        if pending:
            log.warning(
                "%d release(s) left at shutdown: their messages show within %d s",
                len(pending),
                self._hidden_s,
            )
            await asyncio.wait(pending)

    async def _release(self, reservation: Reservation) -> None:
        """Release, trying again a few times (a retried release that landed meets a stale
        receipt, which is fine): slow storage must not hold a fresh post back for ``H``."""
        for pause in (*RELEASE_RETRY_PAUSES_S, None):
            try:
                await self.queue.release(reservation)
                return
            except (StorageUnavailableError, HttpResponseError) as error:  # the fact is stored
                if pause is None:
                    log.warning(
                        "a release failed (%s): its message shows up within %d s",
                        error,
                        self._hidden_s,
                    )
                    return
            await asyncio.sleep(pause * random.uniform(0.5, 1.5))  # noqa: S311 - jitter
