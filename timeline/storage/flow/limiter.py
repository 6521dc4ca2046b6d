"""How many storage requests a worker keeps in flight: as many as storage serves promptly.

A fixed concurrency is wrong on both sides: too low wastes a store that serves requests in
parallel (Azure); too high queues requests inside storage (Azurite serves one at a time, an
Azure partition server throttles) until they time out, are retried, and useful throughput
falls as load rises (congestion collapse), while the API's calls wait in the same queue. So
the worker's limit follows what storage shows, as TCP Vegas does with a network:

- Each kind of request (a point read, a query, a write of some size) has a base latency, the
  least seen lately; a request that took longer spent the difference waiting in a queue.
  Vegas turns that into how many of our requests are queued inside storage:
  ``in flight x (1 - base / latency)``, averaged over a round (about one latency).
- Each round the limit is judged once: it halves when a request timed out, was throttled
  (503/429) or could not connect; it goes down by one when more than ``queue_high`` of our
  requests wait inside storage (or latency passed ``latency_target_s``, well below the
  storage timeout); it goes up when fewer than ``queue_low`` wait and the limit was
  reached: by a quarter per round at first (slow start, until the first sign of a queue),
  then by one.

So on a store that queues, the worker keeps just enough in flight to keep it busy, and
anything else (the API) waits behind a few requests, not hundreds; on a store that serves in
parallel the queue stays empty and the limit grows to its maximum. A throttled response's
``Retry-After`` also holds back ``LOW`` work until it has passed. Waiters are served
``HIGH`` first. An optional request rate (a share of the account's request budget) leaves
the rest of the budget to the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiolimiter import AsyncLimiter

from timeline.model import priority
from timeline.model.priority import Priority

_BACKOFF = 0.5
"""The limit's share kept after a timeout or a throttled request."""
_SLOW_START = 1.25
_MIN_ROUND_S = 0.05
_BASE_WINDOW_S = 30.0
"""A kind's base latency is the least of the last one or two such windows, so it follows
storage getting slower for good (a bigger table, a busier account) within a minute."""
_RETRY_AFTER_CAP_S = 30.0
_LOW_TURN = 5
"""While both wait, one place in this many goes to background work."""


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    initial: int = 16
    minimum: int = 2
    """Enough for the client to build a request while storage serves the last one."""
    maximum: int = 256
    queue_low: float = 3.0
    """Below this many of our requests waiting inside storage, the limit may grow."""
    queue_high: float = 6.0
    """Above this many, it shrinks."""
    latency_target_s: float = 1.0
    """Above this average latency storage is congested, whatever the estimate says."""
    requests_per_s: float | None = None
    """At most this many requests a second (None: no rate bound)."""


class AdaptiveLimiter:
    """A semaphore whose size follows storage's queueing; see the module docstring."""

    def __init__(
        self, settings: LimiterSettings | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.settings = settings or LimiterSettings()
        self.limit = float(self.settings.initial)
        self.in_flight = 0
        self._clock = clock or time.monotonic
        self._waiters: tuple[deque[asyncio.Future[None]], ...] = tuple(deque() for _ in Priority)
        self._base: dict[str, _BaseLatency] = {}
        self._round = _Round(ends=0.0)
        self._slow_start = True
        self._granted = 0
        """Places handed to ``HIGH`` waiters since the last went to a ``LOW`` one."""
        self._hold_low_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        rate = self.settings.requests_per_s
        self._rate = AsyncLimiter(rate, 1.0) if rate else None

    def waiting(self, level: Priority) -> int:
        return len(self._waiters[level])

    @asynccontextmanager
    async def slot(self, kind: str = "other") -> AsyncIterator[Outcome]:
        """Hold one of the limit's places for one request of ``kind``; the caller marks the
        outcome (left as is: a normal answer, timed from entry to exit)."""
        if self._rate is not None:
            await self._rate.acquire()
        await self._acquire(priority.current())
        outcome = Outcome(started=self._clock())
        try:
            yield outcome
        finally:
            if not outcome.cancelled:
                self._observe(kind, outcome, self._clock())
            self._finish()

    async def _acquire(self, level: Priority) -> None:
        if self._may_start(level) and not any(self._waiters[: level + 1]):
            self._start()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[level].append(waiter)
        self._wake()  # arms the hold's timer when this is the first background waiter
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._finish()  # it was handed a place just as it was cancelled
            else:  # still waiting, or already passed over by ``_wake`` as cancelled
                with contextlib.suppress(ValueError):
                    self._waiters[level].remove(waiter)
            raise

    def _may_start(self, level: Priority) -> bool:
        if self.in_flight >= math.floor(self.limit):
            return False
        return level == Priority.HIGH or self._clock() >= self._hold_low_until

    def _start(self) -> None:
        self.in_flight += 1
        self._round.peak = max(self._round.peak, self.in_flight)

    def _finish(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand free places to waiters, ``HIGH`` first, but every ``_LOW_TURN``-th place to a
        ``LOW`` waiter when there is one: background work slows down, never stops."""
        while True:
            level = self._next_level()
            if level is None:
                break
            waiter = self._waiters[level].popleft()
            if not waiter.done():
                self._start()
                self._granted = 0 if level == Priority.LOW else self._granted + 1
                waiter.set_result(None)
        held = self._hold_low_until - self._clock()
        if self._waiters[Priority.LOW] and held > 0 and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(held, self._timer_fired)

    def _next_level(self) -> Priority | None:
        ready = [level for level in Priority if self._waiters[level] and self._may_start(level)]
        if not ready:
            return None
        if Priority.LOW in ready and self._granted >= _LOW_TURN - 1:
            return Priority.LOW
        return ready[0]

    def _timer_fired(self) -> None:
        self._timer = None
        self._wake()

    def _observe(self, kind: str, outcome: Outcome, now: float) -> None:
        latency = now - outcome.started
        current = self._round
        if outcome.congested:
            current.congested = True
            if outcome.retry_after:
                hold = min(outcome.retry_after, _RETRY_AFTER_CAP_S)
                self._hold_low_until = max(self._hold_low_until, now + hold)
        else:
            base = self._base.setdefault(kind, _BaseLatency())
            least = base.observe(latency, now)
            current.samples += 1
            current.latency += latency
            current.queued += self.in_flight * (1 - least / latency) if latency > 0 else 0.0
        if now >= current.ends:
            self._judge(current)
            average = current.latency / current.samples if current.samples else 0.0
            self._round = _Round(ends=now + max(_MIN_ROUND_S, average), peak=self.in_flight)

    def _judge(self, finished: _Round) -> None:
        settings = self.settings
        queued = finished.queued / finished.samples if finished.samples else 0.0
        latency = finished.latency / finished.samples if finished.samples else 0.0
        if finished.congested:
            self._lower(self.limit * _BACKOFF)
        elif queued > settings.queue_high or latency > settings.latency_target_s:
            self._lower(self.limit - 1)
        elif queued < settings.queue_low and finished.peak >= math.floor(self.limit):
            grown = self.limit * _SLOW_START if self._slow_start else self.limit + 1
            self.limit = min(float(settings.maximum), grown)
        elif queued >= settings.queue_low:
            self._slow_start = False
        self._wake()

    def _lower(self, limit: float) -> None:
        self.limit = max(float(self.settings.minimum), limit)
        self._slow_start = False


@dataclass(slots=True)
class Outcome:
    """How one request went, as the limiter needs to know it."""

    started: float
    congested: bool = False
    """Timed out, throttled, or storage could not be reached."""
    retry_after: float | None = None
    cancelled: bool = False
    """Abandoned by the caller: says nothing about storage."""


@dataclass(slots=True)
class _Round:
    ends: float
    peak: int = 0
    samples: int = 0
    latency: float = 0.0
    queued: float = 0.0
    congested: bool = False


@dataclass(slots=True)
class _BaseLatency:
    """The least latency of one kind of request over the last one or two windows."""

    current: float = math.inf
    previous: float = math.inf
    window_ends: float = -math.inf

    def observe(self, latency: float, now: float) -> float:
        if now >= self.window_ends:
            self.previous, self.current = self.current, math.inf
            self.window_ends = now + _BASE_WINDOW_S
        self.current = min(self.current, latency)
        return min(self.current, self.previous)
