"""How many storage requests a worker keeps in flight: as many as storage serves promptly.

A fixed concurrency is wrong on both sides: too low wastes a fast store; too high queues
requests inside storage until they time out, are retried, and useful throughput falls as
load rises (congestion collapse), while the API's calls wait in the same queue. So the
worker's limit moves with what storage shows, as TCP does with a network (AIMD; the latency
signal is TCP Vegas's and Netflix concurrency-limits' Gradient2):

- every round trip (about one smoothed request latency) the limit is judged once;
- it halves when a request timed out, was throttled (503/429) or failed to connect;
- it shrinks by a fifth when latency grows: the recent average above ``tolerance`` times the
  long-run average, or above ``latency_target_s`` (set well below the storage timeout, so
  the limit falls long before requests time out);
- otherwise, if the limit was actually reached in that round, it grows: doubling-ish at
  first (slow start, until the first sign of congestion), then by one per round.

A throttled response's ``Retry-After`` also holds back ``LOW`` work until it has passed.
Waiters are served ``HIGH`` first. An optional request rate (a share of the account's
request budget) leaves the rest of the budget to the API.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiolimiter import AsyncLimiter

from timeline import priority
from timeline.priority import Priority

_DECREASE = 0.8
"""The limit's share kept when latency grows."""
_BACKOFF = 0.5
"""The limit's share kept after a timeout or a throttled request."""
_SLOW_START = 1.25
_MIN_ROUND_S = 0.05
_SHORT_WEIGHT = 0.1
_LONG_WEIGHT = 0.005
_RETRY_AFTER_CAP_S = 30.0


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    initial: int = 16
    minimum: int = 2
    maximum: int = 256
    latency_target_s: float = 1.0
    """Above this smoothed latency storage is congested, whatever it was before."""
    tolerance: float = 2.0
    """How far the recent latency may rise above the long-run one before it counts."""
    requests_per_s: float | None = None
    """At most this many requests a second (None: no rate bound)."""


class AdaptiveLimiter:
    """A semaphore whose size follows storage's latency; see the module docstring."""

    def __init__(self, settings: LimiterSettings | None = None) -> None:
        self.settings = settings or LimiterSettings()
        self.limit = float(self.settings.initial)
        self.in_flight = 0
        self._waiters: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque())
        self._short: float | None = None
        self._long: float | None = None
        self._round_ends = 0.0
        self._round_peak = 0
        self._round_congested = False
        self._slow_start = True
        self._hold_low_until = 0.0
        self._timer: asyncio.TimerHandle | None = None
        rate = self.settings.requests_per_s
        self._rate = AsyncLimiter(rate, 1.0) if rate else None
        self.decreases = 0
        """How often the limit was lowered (for metrics and tests)."""

    def waiting(self, level: Priority) -> int:
        return len(self._waiters[level])

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[Outcome]:
        """Hold one of the limit's places for one request; the caller fills in the outcome
        (left as is: a normal answer, timed from entry to exit)."""
        if self._rate is not None:
            await self._rate.acquire()
        await self._acquire(priority.current())
        loop = asyncio.get_running_loop()
        outcome = Outcome(started=loop.time())
        try:
            yield outcome
        finally:
            self._release(outcome, loop.time())

    async def _acquire(self, level: Priority) -> None:
        if self._may_start(level) and not any(self._waiters[: level + 1]):
            self._start()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[level].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._finish()  # it was handed a place just as it was cancelled
            else:
                self._waiters[level].remove(waiter)
            raise

    def _may_start(self, level: Priority) -> bool:
        if self.in_flight >= math.floor(self.limit):
            return False
        return level == Priority.HIGH or asyncio.get_running_loop().time() >= self._hold_low_until

    def _start(self) -> None:
        self.in_flight += 1
        self._round_peak = max(self._round_peak, self.in_flight)

    def _finish(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _release(self, outcome: Outcome, now: float) -> None:
        if not outcome.cancelled:
            self._observe(outcome, now)
        self._finish()

    def _wake(self) -> None:
        """Hand free places to waiters, ``HIGH`` first."""
        for level in Priority:
            queue = self._waiters[level]
            while queue and self._may_start(level):
                waiter = queue.popleft()
                if not waiter.done():
                    self._start()
                    waiter.set_result(None)
        if self._waiters[Priority.LOW] and self._timer is None:
            loop = asyncio.get_running_loop()
            if loop.time() < self._hold_low_until:
                self._timer = loop.call_at(self._hold_low_until, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._wake()

    def _observe(self, outcome: Outcome, now: float) -> None:
        latency = now - outcome.started
        if outcome.congested:
            self._round_congested = True
            if outcome.retry_after:
                hold = min(outcome.retry_after, _RETRY_AFTER_CAP_S)
                self._hold_low_until = max(self._hold_low_until, now + hold)
        else:
            self._short = _average(self._short, latency, _SHORT_WEIGHT)
            self._long = _average(self._long, latency, _LONG_WEIGHT)
            if self._long < self._short / (2 * self.settings.tolerance):
                self._long = self._short / (2 * self.settings.tolerance)  # drift after overload
        if now >= self._round_ends:
            self._judge_round()
            self._round_ends = now + max(_MIN_ROUND_S, self._short or 0.0)

    def _judge_round(self) -> None:
        settings = self.settings
        if self._round_congested:
            self._lower(_BACKOFF)
        elif (
            self._short is not None
            and self._long is not None
            and (
                self._short > settings.latency_target_s
                or self._short > settings.tolerance * self._long
            )
        ):
            self._lower(_DECREASE)
        elif self._round_peak >= math.floor(self.limit):
            grown = self.limit * _SLOW_START if self._slow_start else self.limit + 1
            self.limit = min(float(settings.maximum), grown)
        self._round_congested = False
        self._round_peak = self.in_flight
        self._wake()

    def _lower(self, share: float) -> None:
        self.limit = max(float(self.settings.minimum), self.limit * share)
        self._slow_start = False
        self.decreases += 1


@dataclass(slots=True)
class Outcome:
    """How one request went, as the limiter needs to know it."""

    started: float
    congested: bool = False
    """Timed out, throttled, or storage could not be reached."""
    retry_after: float | None = None
    cancelled: bool = False
    """Abandoned by the caller: says nothing about storage."""


def _average(previous: float | None, sample: float, weight: float) -> float:
    return sample if previous is None else previous + weight * (sample - previous)
