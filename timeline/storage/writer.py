"""Coalesce single-entity timeline writes by partition into Entity Group Transactions.

Fan-out produces one write per follower partition. Writes are buffered per partition and a
partition is sent as one request when it holds 100 operations or its linger has passed.
While every request slot is busy, waiting partitions keep absorbing writes, so batches grow
exactly when storage is the bottleneck and stay small (low lag) when it is not.

Partitions wait in two lanes by the priority of the work that wrote them
(``timeline.model.priority``): a partition holding a ``HIGH`` row is sent before any ``LOW`` one,
and ``HIGH`` work is admitted by the ``HIGH`` backlog alone, so a fresh post never waits
behind a deep backlog of backfills.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from timeline.errors import DeadlineExceededError, StorageUnavailableError
from timeline.metrics import (
    BATCH_SIZE,
    DELIVERIES,
    LAG,
    REMOVALS,
    WRITE_REQUESTS,
    WRITE_RETRIES,
    WRITES_EXPIRED,
)
from timeline.model import priority
from timeline.model.keys import now_ticks
from timeline.model.priority import Priority
from timeline.retry import backoff_delay, retry_after_of
from timeline.storage.accounts import Storage
from timeline.storage.calls import MAX_BATCH_OPERATIONS, Operation, submit_batch, submit_fresh

log = logging.getLogger(__name__)

_RATE_WINDOW_S = 5.0
_FIRST_RATE = 100.0
"""Rows per second assumed before any were written (and the least ever assumed): admission
never stops a lone page."""
BACKGROUND_SHARE = 0.75
"""Of the buffer, what ``LOW`` rows may fill."""
_NOW = float("-inf")
"""The deadline of a partition that must go out at once (full, or flushing)."""


class Tracker:
    """Counts the outstanding writes of one unit of work (one message's share of a fan-out).

    It resolves only once its producer has said it is done adding (``wait``) and every write
    added has committed: early rows may commit while later ones are still being added."""

    def __init__(self) -> None:
        self._pending = 0
        self._sealed = False
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add(self) -> None:
        self._pending += 1

    def settle(self, error: BaseException | None = None) -> None:
        if self._done.done():
            return
        if error is not None:
            self._done.set_exception(error)
            return
        self._pending -= 1
        self._resolve_if_complete()

    async def wait(self) -> None:
        """Seal the tracker (nothing more will be added), then return when every write has
        committed; raise the first failure."""
        self._sealed = True
        self._resolve_if_complete()
        await self._done

    def _resolve_if_complete(self) -> None:
        if self._sealed and self._pending == 0 and not self._done.done():
            self._done.set_result(None)


@dataclass(slots=True)
class _Pending:
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


class PartitionWriter:
    """Buffers writes to one table by partition; sends full or lingered partitions as EGTs."""

    def __init__(
        self,
        storage: Storage,
        table: str,
        *,
        linger_s: float = 0.05,
        max_in_flight: int = 64,
        max_buffered: int = 20_000,
        max_attempts: int = 6,
    ) -> None:
        self._storage = storage
        self._table = table
        self._linger_s = linger_s
        self._max_attempts = max_attempts
        self._buffers: dict[str, dict[str, _Pending]] = {}
        self._lanes: tuple[OrderedDict[str, float], ...] = tuple(OrderedDict() for _ in Priority)
        """Per priority, each waiting partition's send deadline, in sending order."""
        self._lane_of: dict[str, Priority] = {}
        self._wakeup = asyncio.Event()
        self._urgent = asyncio.Event()
        """Set when a ``HIGH`` row arrives."""
        self._slots = asyncio.Semaphore(max_in_flight)
        self._space = asyncio.Semaphore(max_buffered)
        self._background_space = asyncio.Semaphore(max(1, int(max_buffered * BACKGROUND_SHARE)))
        """``LOW`` rows may fill only part of the buffer: a fresh post's copies always fit."""
        self._sends: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._flushing = 0
        self._closed = False
        self._rows = [0 for _ in Priority]
        self._reserved = [0 for _ in Priority]
        self._committed: deque[tuple[float, int]] = deque()
        self._progress = asyncio.Event()
        self.requests = 0
        """Write requests this writer has sent, retries included."""
        self.admission_waiters = 0
        """Units of work waiting in ``admission`` for the backlog to drain."""

    async def __aenter__(self) -> PartitionWriter:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close(None)

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self._run(), name=f"flush-{self._table}")

    async def close(self, timeout_s: float | None) -> None:
        """Flush for at most ``timeout_s`` (None: until done); then drop what is left, failing
        its trackers. Idempotent.

        Dropping loses nothing: a message whose writes did not all commit is never deleted
        from the queue, so it is delivered again once storage answers.
        """
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self.flush(), timeout_s)
        except TimeoutError:
            log.warning(
                "closing with %d rows unwritten; their messages will be retried", self.buffered
            )
        assert self._flusher is not None
        self._flusher.cancel()
        sends = list(self._sends)
        for task in sends:
            task.cancel()
        await asyncio.gather(self._flusher, *sends, return_exceptions=True)
        abandoned = StorageUnavailableError(
            "the writer closed before this row was written", retry_after=1
        )
        for rows in self._buffers.values():
            for pending in rows.values():
                for tracker in pending.trackers:
                    tracker.settle(abandoned)
        self._buffers.clear()
        self._lane_of.clear()
        self._rows = [0 for _ in Priority]
        self._progress.set()
        for lane in self._lanes:
            lane.clear()

    @property
    def buffered(self) -> int:
        return sum(self._rows)

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

    async def upsert(
        self,
        partition: str,
        row_key: str,
        properties: dict[str, Any],
        tracker: Tracker,
        *,
        deadline: float,
        created_ticks: int | None = None,
    ) -> None:
        """Queue an upsert (REPLACE) that must be sent before ``deadline`` (loop time) or not at
        all: the reason for it was read from storage at a known time, and the sweeps that undo
        stale copies count on no copy landing long after that. ``created_ticks`` marks a live
        delivery for the lag metric."""
        await self._add(partition, row_key, properties, tracker, created_ticks, deadline)

    async def delete(self, partition: str, row_key: str, tracker: Tracker) -> None:
        """Queue an unconditional delete: only for copies whose post is gone for good."""
        await self._add(partition, row_key, None, tracker, None, None)

    async def flush(self) -> None:
        """Send everything buffered now, and wait until all of it is written."""
        self._flushing += 1
        try:
            self._wakeup.set()
            while self._buffers or self._sends:
                if self._sends:
                    await asyncio.wait(self._sends)
                else:
                    await asyncio.sleep(0.001)
        finally:
            self._flushing -= 1

    async def _add(
        self,
        partition: str,
        row: str,
        properties: dict[str, Any] | None,
        tracker: Tracker,
        created_ticks: int | None,
        deadline: float | None,
    ) -> None:
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
            self._urgent.set()
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
            pending = rows[row] = _Pending(row, properties, created_ticks, deadline, background)
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

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                await self._storage_has_room()
                partition = await self._next_due()
            except BaseException:
                self._slots.release()
                raise
            level = self._lane_of[partition]
            batch = self._take(partition)
            task = asyncio.create_task(self._send(partition, batch, level))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _storage_has_room(self) -> None:
        """With an adaptive limiter, take a batch only while fewer are out than it lets
        through: a batch is formed when it is taken, so one that waited in the limiter would
        have stopped absorbing writes (batches grow while storage is busy, not while they
        queue)."""
        limiter = self._storage.options.limiter
        while (
            limiter is not None
            and not self._lanes[Priority.HIGH]  # a fresh post's batch never waits here
            and len(self._sends) >= max(1, int(limiter.limit))
        ):
            self._urgent.clear()
            urgent = asyncio.ensure_future(self._urgent.wait())
            try:
                await asyncio.wait({*self._sends, urgent}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                urgent.cancel()

    async def _next_due(self) -> str:
        """The partition to send next: the most urgent lane first; in a lane, full ones
        first, then by linger deadline."""
        loop = asyncio.get_running_loop()
        while True:
            timeout: float | None = None
            for lane in self._lanes:
                if lane:
                    partition, deadline = next(iter(lane.items()))
                    if deadline <= loop.time() or self._flushing:
                        return partition
                    wait = deadline - loop.time()
                    timeout = wait if timeout is None else min(timeout, wait)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    def _take(self, partition: str) -> list[_Pending]:
        """Remove up to 100 rows of ``partition``; a remainder waits as a due partition."""
        rows = self._buffers[partition]
        level = self._lane_of[partition]
        lane = self._lanes[level]
        del lane[partition]
        if len(rows) <= MAX_BATCH_OPERATIONS:
            del self._buffers[partition]
            del self._lane_of[partition]
            self._rows[level] -= len(rows)
            return list(rows.values())
        keys = list(rows)[:MAX_BATCH_OPERATIONS]
        batch = [rows.pop(key) for key in keys]
        self._rows[level] -= len(batch)
        lane[partition] = _NOW
        lane.move_to_end(partition, last=False)
        return batch

    async def _send(self, partition: str, batch: list[_Pending], level: Priority) -> None:
        sent = batch
        error: BaseException | None = None
        try:
            with priority.running_as(level):
                sent = await self._write_with_retries(partition, batch)
        except Exception as failure:
            error = failure
            log.warning("writing %d rows of %s failed: %s", len(batch), partition, failure)
        except asyncio.CancelledError:
            error = StorageUnavailableError("the write was abandoned at close", retry_after=1)
            raise
        finally:
            self._slots.release()
            for pending in batch:
                self._release_space(pending.background)
            if error is None:
                _record(sent)
                self._committed.append((asyncio.get_running_loop().time(), len(sent)))
            self._progress.set()
            for pending in sent:
                for tracker in pending.trackers:
                    tracker.settle(error)

    async def _write_with_retries(self, partition: str, batch: list[_Pending]) -> list[_Pending]:
        """Write the upserts, then the deletes, each as one request: an upsert request never
        meets a missing row, so it is one call per attempt and its deadline check holds;
        deletes may meet missing rows (dropped and resent) but need no deadline."""
        upserts = [pending for pending in batch if pending.properties is not None]
        deletes = [pending for pending in batch if pending.properties is None]
        written = await self._attempts(partition, upserts) if upserts else []
        if deletes:
            written += await self._attempts(partition, deletes)
        return written

    async def _attempts(self, partition: str, batch: list[_Pending]) -> list[_Pending]:
        """Retry the idempotent batch on outages: azure-core does not retry POST on a lost
        connection, and throttling (503/429) asks the client to back off. Upserts past their
        deadline are dropped at the last moment before each attempt, once the request holds
        its place to go out (their trackers fail, so their messages are retried with a fresh
        read); deletes need no deadline. Returns the rows that were written."""
        remaining = batch

        def unexpired() -> list[Operation]:
            nonlocal remaining
            remaining = _drop_expired(remaining)
            return [pending.operation(partition) for pending in remaining]

        for attempt in range(1, self._max_attempts + 1):
            try:
                WRITE_REQUESTS.inc()
                self.requests += 1
                if batch[0].properties is None:
                    await submit_batch(self._storage, self._table, partition, unexpired())
                else:
                    await submit_fresh(
                        self._storage, self._table, partition, unexpired, len(remaining)
                    )
                return remaining
            except StorageUnavailableError as error:
                if attempt == self._max_attempts:
                    raise
                WRITE_RETRIES.inc()
                await asyncio.sleep(backoff_delay(attempt, retry_after=retry_after_of(error)))
        return remaining


def _drop_expired(batch: list[_Pending]) -> list[_Pending]:
    now = asyncio.get_running_loop().time()
    keep = [p for p in batch if p.deadline is None or p.deadline >= now]
    if len(keep) < len(batch):
        late = DeadlineExceededError("a write's reason is too old to send; it will be re-read")
        for pending in batch:
            if pending.deadline is not None and pending.deadline < now:
                for tracker in pending.trackers:
                    tracker.settle(late)
        WRITES_EXPIRED.inc(len(batch) - len(keep))
    return keep


def _later(first: float | None, second: float | None) -> float | None:
    return second if first is None else first if second is None else max(first, second)


def _record(batch: list[_Pending]) -> None:
    BATCH_SIZE.observe(len(batch))
    now = now_ticks()
    delivered = 0
    for pending in batch:
        if pending.properties is None:
            continue
        delivered += 1
        if pending.created_ticks is not None:
            LAG.observe(max(0, now - pending.created_ticks) / 10_000_000)
    DELIVERIES.inc(delivered)
    REMOVALS.inc(len(batch) - delivered)
