"""Coalesce single-entity timeline writes by partition into Entity Group Transactions.

Fan-out produces one write per follower partition. Writes are buffered per partition and a
partition is sent as one request when it holds 100 operations or its linger has passed.
While every request slot is busy, waiting partitions keep absorbing writes, so batches grow
exactly when storage is the bottleneck and stay small (low lag) when it is not.

Partitions wait in two lanes by the priority of the work that wrote them; see
``timeline.delivery.batching.write_buffer`` for the lanes, the buffer's room and admission.
This module sends: the loop that takes due partitions, and each batch's retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from timeline.delivery.batching.tracker import Tracker
from timeline.delivery.batching.write_buffer import Pending, WriteBuffer
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
from timeline.storage.calls import (
    MAX_BATCH_OPERATIONS,
    Operation,
    chunked,
    submit_batch,
    submit_fresh,
)

log = logging.getLogger(__name__)


class PartitionWriter:
    """Buffers writes to one table by partition; sends full or lingered partitions as EGTs.

    About 200 lines: admission, the send loop, retries with their deadline check and close
    share the buffer and the in-flight count, and read best in one place (the buffer's
    bookkeeping itself is ``write_buffer.py``)."""

    def __init__(
        self,
        storage: Storage,
        table: str,
        *,
        linger_s: float = 0.05,
        max_in_flight: int = 64,
        max_buffered: int = 20_000,
        max_attempts: int = 6,
        trace: Callable[[str, str], Operation] | None = None,
    ) -> None:
        """``trace``: the operation that records a delete of (partition, row key), sent in
        the same transaction as the delete (``timeline.tables.traces``); None: none."""
        self._storage = storage
        self._trace = trace
        self._table = table
        self._max_attempts = max_attempts
        self._buffer = WriteBuffer(linger_s=linger_s, max_buffered=max_buffered)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._sends: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False
        self.requests = 0
        """Write requests this writer has sent, retries included."""

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
        self._buffer.abandon(
            StorageUnavailableError("the writer closed before this row was written", retry_after=1)
        )

    @property
    def buffered(self) -> int:
        return self._buffer.buffered

    @property
    def admission_waiters(self) -> int:
        """Units of work waiting in ``admission`` for the backlog to drain."""
        return self._buffer.admission_waiters

    def admission(self, drain_within_s: float, rows: int) -> AbstractAsyncContextManager[None]:
        """Wait until the backlog would drain within ``drain_within_s``, then hold room for
        ``rows`` (see ``WriteBuffer.admission``)."""
        return self._buffer.admission(drain_within_s, rows)

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
        await self._buffer.add(partition, row_key, properties, tracker, created_ticks, deadline)

    async def delete(self, partition: str, row_key: str, tracker: Tracker) -> None:
        """Queue an unconditional delete: only for copies whose post is gone for good."""
        await self._buffer.add(partition, row_key, None, tracker, None, None)

    async def flush(self) -> None:
        """Send everything buffered now, and wait until all of it is written."""
        self._buffer.flushing += 1
        try:
            self._buffer.wake()
            while not self._buffer.empty or self._sends:
                if self._sends:
                    await asyncio.wait(self._sends)
                else:
                    await asyncio.sleep(0.001)
        finally:
            self._buffer.flushing -= 1

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                await self._storage_has_room()
                partition = await self._buffer.next_due()
            except BaseException:
                self._slots.release()
                raise
            level, batch = self._buffer.take(partition)
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
            and not self._buffer.high_waiting  # a fresh post's batch never waits here
            and len(self._sends) >= max(1, int(limiter.limit))
        ):
            self._buffer.urgent.clear()
            urgent = asyncio.ensure_future(self._buffer.urgent.wait())
            try:
                await asyncio.wait({*self._sends, urgent}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                urgent.cancel()

    async def _send(self, partition: str, batch: list[Pending], level: Priority) -> None:
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
            self._buffer.sent(batch, None if error is not None else len(sent))
            if error is None:
                _record(sent)
            for pending in sent:
                for tracker in pending.trackers:
                    tracker.settle(error)

    async def _write_with_retries(self, partition: str, batch: list[Pending]) -> list[Pending]:
        """Write the upserts, then the deletes, each as one request: an upsert request never
        meets a missing row, so it is one call per attempt and its deadline check holds;
        deletes may meet missing rows (dropped and resent) but need no deadline."""
        upserts = [pending for pending in batch if pending.properties is not None]
        deletes = [pending for pending in batch if pending.properties is None]
        written = await self._attempts(partition, upserts) if upserts else []
        per_request = MAX_BATCH_OPERATIONS // 2 if self._trace else MAX_BATCH_OPERATIONS
        for chunk in chunked(deletes, per_request):
            written += await self._attempts(partition, chunk)
        return written

    async def _attempts(self, partition: str, batch: list[Pending]) -> list[Pending]:
        """Retry the idempotent batch on outages: azure-core does not retry POST on a lost
        connection, and throttling (503/429) asks the client to back off. Upserts past their
        deadline are dropped at the last moment before each attempt, once the request holds
        its place to go out (their trackers fail, so their messages are retried with a fresh
        read); deletes need no deadline. Returns the rows that were written."""
        remaining = batch

        def unexpired() -> list[Operation]:
            nonlocal remaining
            remaining = _drop_expired(remaining)
            return [op for pending in remaining for op in self._operations(pending, partition)]

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

    def _operations(self, pending: Pending, partition: str) -> list[Operation]:
        """A row's operation, and a delete's trace after it (see ``__init__``)."""
        operation = pending.operation(partition)
        if operation[0] != "delete" or self._trace is None:
            return [operation]
        return [operation, self._trace(partition, pending.row_key)]


def _drop_expired(batch: list[Pending]) -> list[Pending]:
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


def _record(batch: list[Pending]) -> None:
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
