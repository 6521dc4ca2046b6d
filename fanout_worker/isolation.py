"""Crash attribution by isolation: a worker's death is evidence only against what it ran.

A lease that ended with no outcome (the queue's dequeue count ran ahead of ``released``)
makes its message a *suspect*: it may have killed the worker, or merely been beside the
one that did, or been leased and never started. Suspects never run in normal company. A
worker holding one stops admitting normal work, lets what runs finish, then runs suspects
in groups, with nothing else running in the process; the group shrinks with each run that
ends in a dead worker (``GROUP_SIZES``), down to one. Just before a group starts each
member is *marked*: its queue message is rewritten with its level, its solo-crash count
and ``released`` set to the current dequeue count, so the next lease counts only this
marked run. Leases a suspect was merely held in change nothing, so they count nothing.
Only a message that ended ``max_solo_crashes`` runs alone in a dead worker is quarantined.
See docs/crash-attribution.md for the interleavings.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from timeline.model.messages import FanoutMessage

GROUP_SIZES = (16, 4, 1)
"""How many suspects run together at levels 1, 2 and 3 (alone)."""
SOLO = len(GROUP_SIZES)


@dataclass(frozen=True, slots=True)
class Suspicion:
    """What a lease's bookkeeping says about a message: run normally (level 0), run at
    ``level`` in isolation, or quarantine it (``verdict`` says why)."""

    level: int = 0
    solo: int = 0
    verdict: str | None = None


NORMAL = Suspicion()


def triage(message: FanoutMessage, dequeue_count: int, max_solo_crashes: int) -> Suspicion:
    """Escalate once per marked run that ended with no outcome, however many leases did."""
    if dequeue_count - 1 - message.released < 1:
        return NORMAL
    if message.level < SOLO:
        return Suspicion(level=message.level + 1)
    solo = message.solo + 1
    if solo >= max_solo_crashes:
        verdict = f"it killed the worker each of the {solo} times it ran alone"
        return Suspicion(SOLO, solo, verdict)
    return Suspicion(SOLO, solo)


def marked(message: FanoutMessage, suspicion: Suspicion, dequeue_count: int) -> FanoutMessage:
    """The message as rewritten just before its isolated run."""
    update = {"level": suspicion.level, "solo": suspicion.solo, "released": dequeue_count}
    return message.model_copy(update=update)


@dataclass(eq=False)
class _Member:
    level: int


class Isolation:
    """The gate every leased message passes before it runs (one per worker process).

    Normal messages pass while no suspect waits; suspects pass in groups of one level, only
    when nothing else runs. State changes are synchronous (one event loop), and waiters
    re-check their condition on every change."""

    def __init__(self, on_idle: Callable[[], None]) -> None:
        self._on_idle = on_idle
        self._running = 0
        self._waiting: list[_Member] = []
        self._group: set[_Member] = set()
        self._stopping = False
        self._change = asyncio.Event()

    @property
    def busy(self) -> bool:
        """Suspects wait or run: no new normal work should be leased meanwhile."""
        return bool(self._waiting or self._group)

    def stop(self) -> None:
        """Messages still waiting at the gate are turned away (their leases handed back)."""
        self._stopping = True
        self._changed()

    @contextlib.asynccontextmanager
    async def admit(self, level: int) -> AsyncIterator[bool]:
        """Wait for the message's turn; yields False if the worker stops first."""
        member = _Member(level) if level else None
        admitted = False
        try:
            admitted = await self._enter(member)
            yield admitted
        finally:
            self._leave(member, admitted)

    async def _enter(self, member: _Member | None) -> bool:
        if member is None:
            await self._until(lambda: not self.busy or self._stopping)
            if self._stopping:
                return False
            self._running += 1
            return True
        self._waiting.append(member)
        self._schedule()
        await self._until(lambda: member in self._group or self._stopping)
        return member in self._group

    def _leave(self, member: _Member | None, admitted: bool) -> None:
        if member is None:
            self._running -= admitted
        else:
            self._group.discard(member)
            if member in self._waiting:
                self._waiting.remove(member)
        self._schedule()
        self._changed()
        if not self.busy:
            self._on_idle()

    def _schedule(self) -> None:
        """Start the next group (the oldest suspect's level) once nothing else runs."""
        if self._group or self._running or not self._waiting or self._stopping:
            return
        level = self._waiting[0].level
        same = [member for member in self._waiting if member.level == level]
        self._group = set(same[: GROUP_SIZES[level - 1]])
        self._waiting = [member for member in self._waiting if member not in self._group]
        self._changed()

    async def _until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._change.wait()

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()
