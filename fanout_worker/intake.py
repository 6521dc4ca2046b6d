"""Leasing messages as room allows: the receivers' loop and the places for messages in flight."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from azure.storage.queue import QueueMessage

from fanout_worker.idle import IdlePace
from fanout_worker.isolation import Isolation
from fanout_worker.metrics import IN_FLIGHT
from timeline.config import Settings
from timeline.errors import StorageUnavailableError
from timeline.model.priority import Priority
from timeline.retry import backoff_delay
from timeline.storage.flow.limiter import AdaptiveLimiter
from timeline.storage.queue import Lane

log = logging.getLogger(__name__)

MAX_RECEIVE = 32
"""Azure Storage Queues lease at most 32 messages per request."""
BACKGROUND_SHARE = 0.75
"""Of the places for messages in flight, what background work may hold: the rest is kept
for user-facing work, which never waits for a backlog of backfills to finish."""
MESSAGES_PER_REQUEST = 4
"""Background messages in flight per table request the limiter lets out: enough to keep it
busy; more would only wait in the limiter while their leases cost renewals (and a death
touches more of them)."""

Start = Callable[[Lane, QueueMessage], Coroutine[Any, Any, None]]
"""Works on one leased message, from start to settled."""


class Intake:
    """Leases messages with at most ``worker_concurrency`` of them in flight.

    Concurrency is capped by counting in-flight messages plus leases being requested.
    Background work may hold at most ``BACKGROUND_SHARE`` of the places, so a fresh post
    always finds room, and the background is never starved (its receivers never wait for
    the user-facing queues). A message's place is released from its task's done-callback."""

    def __init__(
        self,
        settings: Settings,
        limiter: AdaptiveLimiter,
        isolation: Isolation,
        stopping: asyncio.Event,
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._limiter = limiter
        self._isolation = isolation
        self._stopping = stopping
        self._sleep = sleep
        """Waits between receives; wakes at once when the worker is asked to stop."""
        self.in_flight: set[asyncio.Task[None]] = set()
        self._started = 0
        """Messages started so far (burst mode sees whether one started while it looked)."""
        self._background: set[asyncio.Task[None]] = set()
        self._reserved = [0 for _ in Priority]
        self._capacity = asyncio.Condition()
        self._notifiers: set[asyncio.Future[None]] = set()
        self.pace = IdlePace(
            settings.worker_idle_sleep_s, settings.worker_idle_max_sleep_s, stopping
        )
        """Idle receivers' back-off, shared so that one receiver's work wakes all of them."""

    async def receive(
        self, shards: list[Lane], first: int, level: Priority, start: Start, *, lookout: bool
    ) -> None:
        """One receiver of one priority: lease as many messages as there is room for, start
        each one.

        Receivers take the shards' lanes in turn, each from its own starting shard, so every
        shard is asked as often as any other; a receiver idles only after a whole round of
        empty lanes, for longer after each such round (``fanout_worker.idle``); the
        ``lookout`` keeps polling at the longest rest while the others wait for work."""
        failures = empty = streak = 0
        turn = first
        since = self.pace.found
        while not self._stopping.is_set():
            count = await self._reserve(level)
            if not count or not shards:
                await self._release(count, level)
                return
            queue, turn = shards[turn % len(shards)], turn + 1
            try:
                messages = await queue.receive(count, self._settings.worker_visibility_timeout_s)
                failures = 0
            except StorageUnavailableError:
                failures += 1
                messages = []
            finally:
                await self._release(count, level)
            if not failures:
                self.pace.received(len(messages), count)
            for message in messages:
                self._track(asyncio.create_task(start(queue, message)), queue.level)
            if messages:
                empty = streak = 0
                since = self.pace.found
            else:
                empty += 1
            if failures:
                await self._sleep(backoff_delay(failures, base=0.2, cap=10))
            elif empty >= len(shards):
                empty, streak = 0, streak + 1
                if await self.pace.rest(streak, lookout, since):
                    streak = 0
                since = self.pace.found

    async def _reserve(self, level: Priority) -> int:
        """Wait for room, then reserve up to 32 places for the messages about to be leased."""
        async with self._capacity:
            await self._capacity.wait_for(lambda: self._room(level) > 0 or self._stopping.is_set())
            if self._stopping.is_set():
                return 0
            count = min(MAX_RECEIVE, self._room(level))
            self._reserved[level] += count
            return count

    async def _release(self, count: int, level: Priority) -> None:
        async with self._capacity:
            self._reserved[level] -= count
            self._capacity.notify_all()

    def _room(self, level: Priority) -> int:
        if self._isolation.busy:  # suspects wait or run: lease nothing new meanwhile
            return 0
        room = self._settings.worker_concurrency - len(self.in_flight) - sum(self._reserved)
        if level == Priority.HIGH:
            return room
        return min(room, self._background_cap() - len(self._background) - self._reserved[level])

    def _background_cap(self) -> int:
        """Background messages in flight: a few per table request storage serves now (the
        limiter), at least one receive's worth, at most ``BACKGROUND_SHARE`` of all. A
        backfill or a later page gains nothing from company (its rows go to partitions of
        its own), so more would only wait, costing lease renewals; posts and deletes keep
        the whole concurrency, since many in flight is what fills their batches."""
        served = MESSAGES_PER_REQUEST * int(self._limiter.limit)
        share = int(self._settings.worker_concurrency * BACKGROUND_SHARE)
        return max(1, min(share, max(MAX_RECEIVE, served)))

    async def drained(self, lanes: list[Lane]) -> bool:
        """Nothing in flight and every lane empty (leased and delayed messages count), with
        no message started while the lanes were asked: only a message in flight adds to them."""
        started = self._started
        if self.in_flight:
            return False
        for lane in lanes:
            try:
                if await lane.depth():
                    return False
            except StorageUnavailableError:
                return False
        return self._started == started and not self.in_flight

    def _track(self, task: asyncio.Task[None], level: Priority) -> None:
        self._started += 1
        self.in_flight.add(task)
        if level == Priority.LOW:
            self._background.add(task)
        IN_FLIGHT.inc()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        """Release the message's place (arq-style, from the task's own callback)."""
        self.in_flight.discard(task)
        self._background.discard(task)
        IN_FLIGHT.dec()
        if not task.cancelled() and task.exception() is not None:
            log.error("message task failed", exc_info=task.exception())
        self.notify()

    def notify(self) -> None:
        """Wake receivers waiting for room, from sync code (callbacks, signal handlers)."""
        notifier = asyncio.ensure_future(self._finished())
        self._notifiers.add(notifier)
        notifier.add_done_callback(self._notifiers.discard)

    async def _finished(self) -> None:
        async with self._capacity:
            self._capacity.notify_all()
