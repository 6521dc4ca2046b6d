"""A queue message's lease, renewed while its work runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from azure.core.exceptions import HttpResponseError
from azure.storage.queue import QueueMessage

from timeline.errors import StorageUnavailableError
from timeline.storage.queue import Lane

log = logging.getLogger(__name__)


RENEW_AT = (0.3, 0.5)
"""Each renewal goes out at a random share of the visibility timeout in this range: leases
taken in one receive would otherwise all renew at the same moment, a burst of queue calls
that can stall a slow storage exactly when it is busiest."""


class Lease:
    """Keeps a message invisible while it is worked on, renewing before half the timeout.

    Stopping waits for a renewal in flight (bounded by the storage timeout) rather than
    cancelling it: a cancelled renewal may have changed the pop receipt on the server. Any
    other call with the pop receipt holds ``held()``, so it never races a renewal."""

    def __init__(self, queue: Lane, message: QueueMessage, visibility_s: int) -> None:
        self.message = message
        self.lost = False
        self.queue = queue
        self._lock = asyncio.Lock()
        self._visibility_s = visibility_s
        self._stop = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lease:
        self._renewer = asyncio.create_task(self._renew())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._renewer is not None
        self._stop.set()
        await self._renewer

    def held(self) -> asyncio.Lock:
        """Hold while calling the queue with this lease's pop receipt."""
        return self._lock

    def _renewal_delay(self) -> float:
        return self._visibility_s * random.uniform(*RENEW_AT)  # noqa: S311 - spread, not secrets

    async def _renew(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._renewal_delay())
                return
            try:
                async with self._lock:
                    self.message = await self.queue.extend(self.message, self._visibility_s)
            except StorageUnavailableError:
                log.warning("could not renew the lease of %s", self.message.id)
            except HttpResponseError as error:
                log.warning("lost the lease of %s: %s", self.message.id, error.reason)
                self.lost = True
                return
