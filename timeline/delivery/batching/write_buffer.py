"""What the partition writer holds before it sends: rows by partition, in priority lanes,
within a bounded buffer, behind admission.

Partitions wait in two lanes by the priority of the work that wrote them
(``timeline.model.priority``): a partition holding a ``HIGH`` row is sent before any ``LOW`` one,
and ``HIGH`` work is admitted by the ``HIGH`` backlog alone, so a fresh post never waits
behind a deep backlog of backfills.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from timeline.delivery.batching.tracker import Tracker
from timeline.model import priority
from timeline.model.priority import Priority
from timeline.storage.calls import MAX_BATCH_OPERATIONS, Operation

_RATE_WINDOW_S = 5.0
_FIRST_RATE = 100.0
"""Rows per second assumed before any were written (and the least ever assumed): admission
never stops a lone page."""
BACKGROUND_SHARE = 0.75
"""Of the buffer, what ``LOW`` rows may fill."""
_NOW = float("-inf")
"""The deadline of a partition that must go out at once (full, or flushing)."""


@dataclass(slots=True)
class Pending:
    """One row's latest operation and every tracker waiting for it. ``properties`` is shared
    by every copy of a post, so a buffered delivery costs a few pointers, not an entity."""

    row_key: str
    properties: dict[str, Any] | None  # None: delete the row
    created_ticks: int | None
    deadline: float | None
    """Loop time after which this upsert may no longer be sent (None: a delete, always safe)."""
    background: bool
    """It holds a place of the buffer's ``LOW`` share too."""
    trackers: list[Tracker] = field(default_factory=list)

    def operation(self, partition: str) -> Operation:
        keys = {"PartitionKey": partition, "RowKey": self.row_key}
        if self.properties is None:
            return ("delete", keys)
        return ("upsert", keys | self.properties)


class WriteBuffer:
    """Buffered rows by partition, each partition waiting in its lane until it is due."""

    def __init__(self, *, linger_s: float, max_buffered: int) -> None:
        self._linger_s = linger_s
        self._buffers: dict[str, dict[str, Pending]] = {}
        self._lanes: tuple[OrderedDict[str, float], ...] = tuple(OrderedDict() for _ in Priority)
        """Per priority, each waiting partition's send deadline, in sending order."""
        self._lane_of: dict[str, Priority] = {}
        self._wakeup = asyncio.Event()
        self.urgent = asyncio.Event()
        """Set when a ``HIGH`` row arrives."""
        self._space = asyncio.Semaphore(max_buffered)
        self._background_space = asyncio.Semaphore(max(1, int(max_buffered * BACKGROUND_SHARE)))
        """``LOW`` rows may fill only part of the buffer: a fresh post's copies always fit."""
        self.flushing = 0
        """While positive, every waiting partition is due at once."""
        self._rows = [0 for _ in Priority]
        self._reserved = [0 for _ in Priority]
        self._committed: deque[tuple[float, int]] = deque()
        self._progress = asyncio.Event()
        self.admission_waiters = 0
        """Units of work waiting in ``admission`` for the backlog to drain."""

    @property
    def buffered(self) -> int:
        return sum(self._rows)

    @property
    def empty(self) -> bool:
        return not self._buffers

    @property
    def high_waiting(self) -> bool:
        """A partition holding a ``HIGH`` row waits to be sent."""
        return bool(self._lanes[Priority.HIGH])

    def wake(self) -> None:
        self._wakeup.set()

    def _backlog(self, level: Priority) -> int:
        """What work of ``level`` waits behind: rows of its lane and the lanes before it."""
        return sum(self._rows[: level + 1]) + sum(self._reserved[: level + 1])

    @contextlib.asynccontextmanager
    async def admission(self, drain_within_s: float, rows: int) -> AsyncIterator[None]:
        """Wait until what is buffered, plus what admitted work is about to add, would be sent
        within ``drain_within_s`` at the rate rows were written lately; then hold room for
        ``rows`` until the block has added its writes. Entered before the reads that justify
        new writes, so a deep backlog delays those reads instead of making their writes miss
        their deadline."""
        level = priority.current()
        self.admission_waiters += 1
        try:
            while self._backlog(level) > drain_within_s * self._write_rate():
                self._progress.clear()
                await self._progress.wait()
        finally:
            self.admission_waiters -= 1
        self._reserved[level] += rows
        try:
            yield
        finally:
            self._reserved[level] -= rows
            self._progress.set()

    def _write_rate(self) -> float:
        """Rows written per second over the last few seconds (a modest guess before any)."""
        now = asyncio.get_running_loop().time()
        while self._committed and self._committed[0][0] < now - _RATE_WINDOW_S:
            self._committed.popleft()
        if not self._committed:
            return _FIRST_RATE
        span = max(1.0, now - self._committed[0][0])
        return max(_FIRST_RATE, sum(rows for _, rows in self._committed) / span)

    async def add(
        self,
        partition: str,
        row: str,
        properties: dict[str, Any] | None,
        tracker: Tracker,
        created_ticks: int | None,
        deadline: float | None,
    ) -> None:
        """Buffer one row's operation, once there is room for it."""
        level = priority.current()
        background = level == Priority.LOW
        if background:
            await self._background_space.acquire()
        try:
            await self._space.acquire()
        except BaseException:
            if background:
                self._background_space.release()
            raise
        if not background:
            self.urgent.set()
        rows = self._buffers.get(partition)
        if rows is None:
            rows = self._buffers[partition] = {}
            self._lane_of[partition] = level
            self._lanes[level][partition] = asyncio.get_running_loop().time() + self._linger_s
            self._wakeup.set()
        elif level < self._lane_of[partition]:
            self._promote(partition, level)
        pending = rows.get(row)
        if pending is None:
            pending = rows[row] = Pending(row, properties, created_ticks, deadline, background)
            self._rows[self._lane_of[partition]] += 1
        else:  # the same row again (a redelivery): the latest operation wins, once
            self._release_space(background)
            pending.properties = properties
            pending.deadline = _later(pending.deadline, deadline) if properties else None
        pending.trackers.append(tracker)
        tracker.add()
        lane = self._lanes[self._lane_of[partition]]
        if len(rows) >= MAX_BATCH_OPERATIONS and lane.get(partition) != _NOW:
            lane[partition] = _NOW
            lane.move_to_end(partition, last=False)
            self._wakeup.set()

    def _release_space(self, background: bool) -> None:
        self._space.release()
        if background:
            self._background_space.release()

    def _promote(self, partition: str, level: Priority) -> None:
        """Move a waiting partition (and its rows) to a more urgent lane."""
        previous = self._lane_of[partition]
        deadline = self._lanes[previous].pop(partition)
        self._lanes[level][partition] = deadline
        if deadline == _NOW:
            self._lanes[level].move_to_end(partition, last=False)
        waiting = len(self._buffers[partition])
        self._rows[previous] -= waiting
        self._rows[level] += waiting
        self._lane_of[partition] = level
        self._wakeup.set()

    async def next_due(self) -> str:
        """The partition to send next: the most urgent lane first; in a lane, full ones
        first, then by linger deadline."""
        loop = asyncio.get_running_loop()
        while True:
            timeout: float | None = None
            for lane in self._lanes:
                if lane:
                    partition, deadline = next(iter(lane.items()))
                    if deadline <= loop.time() or self.flushing:
                        return partition
                    wait = deadline - loop.time()
                    timeout = wait if timeout is None else min(timeout, wait)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    def take(self, partition: str) -> tuple[Priority, list[Pending]]:
        """Remove up to 100 rows of ``partition`` (with the lane they waited in); a remainder
        waits as a due partition."""
        rows = self._buffers[partition]
        level = self._lane_of[partition]
        lane = self._lanes[level]
        del lane[partition]
        if len(rows) <= MAX_BATCH_OPERATIONS:
            del self._buffers[partition]
            del self._lane_of[partition]
            self._rows[level] -= len(rows)
            return level, list(rows.values())
        keys = list(rows)[:MAX_BATCH_OPERATIONS]
        batch = [rows.pop(key) for key in keys]
        self._rows[level] -= len(batch)
        lane[partition] = _NOW
        lane.move_to_end(partition, last=False)
        return level, batch

    def sent(self, batch: list[Pending], committed: int | None) -> None:
        """A batch taken is done with: free its room; ``committed`` rows were written (None:
        the batch failed)."""
        for pending in batch:
            self._release_space(pending.background)
        if committed is not None:
            self._committed.append((asyncio.get_running_loop().time(), committed))
        self._progress.set()

    def abandon(self, error: BaseException) -> None:
        """Drop every buffered row, failing its trackers with ``error``."""
        for rows in self._buffers.values():
            for pending in rows.values():
                for tracker in pending.trackers:
                    tracker.settle(error)
        self._buffers.clear()
        self._lane_of.clear()
        self._rows = [0 for _ in Priority]
        self._progress.set()
        for lane in self._lanes:
            lane.clear()


def _later(first: float | None, second: float | None) -> float | None:
    return second if first is None else first if second is None else max(first, second)
