"""Idle polling that backs off: receivers that keep finding empty queues ask less often."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from fanout_worker.metrics import RECEIVERS_WOKEN, RECEIVES

JITTER = 0.2
"""A rest is its delay less up to this share, at random: receivers and workers that went
idle together drift out of step, and no rest exceeds the cap."""


@dataclass
class Polls:
    """What one worker's receivers did: receives that leased nothing or something, and
    rests cut short because another receiver found work (also served as metrics)."""

    empty: int = 0
    leased: int = 0
    woken: int = 0


class IdlePace:
    """How long a receiver rests after a round of empty lanes, shared by a process's receivers.

    As Azure Functions' queue trigger does: each empty round in a row doubles a receiver's
    rest, from ``base`` up to ``cap``, jittered. A receive that leases anything starts its
    receiver's rests again from ``base``; one that leases all it asked for (a burst) wakes
    every resting receiver at once, and theirs start again too. When backing off (``cap``
    above ``base``), a receiver whose rest has reached the cap stops polling unless it is
    its priority's lookout: it waits for a burst found by any receiver. So an idle worker
    makes one round of receives per priority per ``cap`` at most, and the first message
    after a quiet spell waits at most ``cap`` plus one round of receives to be leased."""

    def __init__(
        self,
        base: float,
        cap: float,
        stopping: asyncio.Event,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.base = base
        self.cap = max(base, cap)
        self._stopping = stopping
        self._rng = rng
        self._work = asyncio.Event()
        self.found = 0
        """Wake-ups so far, in this process (a receiver compares it with what it saw when
        its round began, to miss none)."""
        self.polls = Polls()

    def received(self, leased: int, asked: int) -> None:
        """Count one receive; when it leased all it asked for (more may be waiting: a burst),
        wake every resting receiver. Fewer means that lane is drained: only the receiver
        that leased them starts its rests again, so a trickle keeps the others resting."""
        if not leased:
            self.polls.empty += 1
            RECEIVES.labels("empty").inc()
            return
        self.polls.leased += 1
        RECEIVES.labels("leased").inc()
        if leased >= asked:
            self.found += 1
            self._work.set()
            self._work = asyncio.Event()

    def delay(self, streak: int) -> float:
        """The rest after the ``streak``-th empty round in a row, before jitter."""
        return min(self.cap, self.base * 2.0 ** min(streak - 1, 62))

    def parks(self, streak: int, lookout: bool) -> bool:
        """Whether this receiver stops polling until work is found: backing off, at the
        cap, and not its priority's lookout."""
        return not lookout and self.base < self.cap and self.delay(streak) >= self.cap

    async def rest(self, streak: int, lookout: bool, since: int) -> bool:
        """Rest after ``streak`` empty rounds in a row; True when woken because another
        receiver leased messages (the streak starts again), or had since ``found`` was
        ``since``."""
        if self.found != since:
            return self._woken()
        work = self._work
        delay = self.delay(streak) * (1 - JITTER * self._rng())
        timeout = None if self.parks(streak, lookout) else delay
        waits = [asyncio.ensure_future(work.wait()), asyncio.ensure_future(self._stopping.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if work.is_set() and not self._stopping.is_set():
            return self._woken()
        return False

    def _woken(self) -> bool:
        self.polls.woken += 1
        RECEIVERS_WOKEN.inc()
        return True
