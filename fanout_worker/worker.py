"""The queue-consuming loop: lease, process, delete; poison what can never succeed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from azure.storage.queue import QueueMessage

from fanout_worker.metrics import IN_FLIGHT, MESSAGES, POISONED, QUEUE_DEPTH
from timeline.config import Settings
from timeline.errors import MalformedMessageError, StorageUnavailableError, TimelineError
from timeline.fanout import FanoutProcessor
from timeline.messages import decode
from timeline.queue import FanoutQueue
from timeline.retry import backoff_delay
from timeline.storage import TIMELINES, Storage
from timeline.writer import PartitionWriter

log = logging.getLogger(__name__)

MAX_RECEIVE = 32
"""Azure Storage Queues lease at most 32 messages per request."""


class Worker:
    """Consumes ``fanout`` with at most ``worker_concurrency`` messages in flight.

    Several receivers lease up to 32 messages each; concurrency is capped by counting
    in-flight messages plus leases being requested. Timeline writes of all messages meet in
    one ``PartitionWriter``, which coalesces them per partition into EGT batches.
    At-least-once: a message is deleted only after every write it caused succeeded; a message
    that fails comes back when its lease runs out, and after ``worker_max_deliveries`` tries it
    is parked in ``fanout-poison``. SIGTERM stops receiving, drains, then cancels.
    """

    def __init__(self, settings: Settings, connection_string: str) -> None:
        self._settings = settings
        self._connection_string = connection_string
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._reserved = 0
        self._wake: asyncio.Future[None] | None = None
        self._capacity = asyncio.Condition()
        self._queue: FanoutQueue | None = None
        self._processor: FanoutProcessor | None = None
        self._writer: PartitionWriter | None = None

    def run(self) -> None:
        asyncio.run(self.async_run(install_signal_handlers=True))

    def stop(self) -> None:
        """Stop receiving (safe to call from a signal handler on the loop); then drain."""
        self._stopping.set()
        self._wake = asyncio.ensure_future(self._finished())

    async def async_run(self, *, install_signal_handlers: bool = False) -> None:
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        settings = self._settings
        async with (
            Storage(self._connection_string, settings.storage_options()) as storage,
            PartitionWriter(
                storage,
                TIMELINES,
                linger_s=settings.worker_linger_s,
                max_in_flight=settings.worker_write_concurrency,
                max_buffered=settings.worker_max_buffered,
            ) as writer,
        ):
            self._writer = writer
            self._queue = FanoutQueue(storage)
            self._processor = FanoutProcessor.on(
                storage, writer, follower_page_size=settings.worker_follower_page_size
            )
            log.info(
                "fan-out worker started: %d messages in flight, %d write requests in flight",
                settings.worker_concurrency,
                settings.worker_write_concurrency,
            )
            sampler = asyncio.create_task(self._sample_depth())
            try:
                async with asyncio.TaskGroup() as receivers:
                    for _ in range(settings.worker_receivers):
                        receivers.create_task(self._receive())
            finally:
                sampler.cancel()
                await self._drain()
        log.info("fan-out worker stopped")

    async def _receive(self) -> None:
        """One receiver: lease as many messages as there is room for, start each one."""
        failures = 0
        while not self._stopping.is_set():
            count = await self._reserve()
            if not count:
                return
            try:
                messages = await self._leased_queue().receive(
                    count, self._settings.worker_visibility_timeout_s
                )
                failures = 0
            except StorageUnavailableError:
                failures += 1
                messages = []
            finally:
                await self._release(count)
            for message in messages:
                self._start(message)
            if failures:
                await self._sleep(backoff_delay(failures, base=0.2, cap=10))
            elif not messages:
                await self._sleep(self._settings.worker_idle_sleep_s)

    async def _reserve(self) -> int:
        """Wait for room, then reserve up to 32 places for the messages about to be leased."""
        async with self._capacity:
            await self._capacity.wait_for(lambda: self._room() > 0 or self._stopping.is_set())
            if self._stopping.is_set():
                return 0
            count = min(MAX_RECEIVE, self._room())
            self._reserved += count
            return count

    async def _release(self, count: int) -> None:
        async with self._capacity:
            self._reserved -= count
            self._capacity.notify_all()

    def _room(self) -> int:
        return self._settings.worker_concurrency - len(self._tasks) - self._reserved

    async def _finished(self) -> None:
        async with self._capacity:
            self._capacity.notify_all()

    def _start(self, message: QueueMessage) -> None:
        task = asyncio.create_task(self._process(message))
        self._tasks.add(task)

    async def _process(self, message: QueueMessage) -> None:
        IN_FLIGHT.inc()
        try:
            await self._handle(message)
        finally:
            IN_FLIGHT.dec()
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)
            await self._finished()

    async def _handle(self, message: QueueMessage) -> None:
        queue = self._leased_queue()
        try:
            decoded = decode(message.content)
        except MalformedMessageError as error:
            await self._poison(message, "malformed", error.message)
            return
        deliveries = message.dequeue_count or 1
        if deliveries > self._settings.worker_max_deliveries:
            await self._poison(
                message, "too_many_deliveries", f"failed {deliveries - 1} deliveries"
            )
            return
        lease = _Lease(queue, message, self._settings.worker_visibility_timeout_s)
        try:
            async with lease:
                assert self._processor is not None
                await self._processor.handle(decoded)
            await queue.delete(lease.message)
        except StorageUnavailableError:
            MESSAGES.labels(decoded.type, "storage_unavailable").inc()
            log.warning("storage unavailable; %s %s will be retried", decoded.type, message.id)
            return
        except Exception:
            MESSAGES.labels(decoded.type, "failed").inc()
            log.exception("%s message %s failed; it will be retried", decoded.type, message.id)
            return
        MESSAGES.labels(decoded.type, "done").inc()

    async def _poison(self, message: QueueMessage, reason: str, detail: str) -> None:
        log.warning("poisoning message %s: %s", message.id, detail)
        try:
            await self._leased_queue().poison(message, f"{reason}: {detail}")
        except TimelineError:
            log.warning("could not poison %s now; it will come back", message.id)
            return
        POISONED.labels(reason).inc()

    def _leased_queue(self) -> FanoutQueue:
        assert self._queue is not None, "async_run() sets the queue"
        return self._queue

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _sample_depth(self) -> None:
        while True:
            try:
                work, poison = await self._leased_queue().depth()
                QUEUE_DEPTH.labels("fanout").set(work)
                QUEUE_DEPTH.labels("fanout-poison").set(poison)
            except StorageUnavailableError:
                pass
            await asyncio.sleep(5)

    async def _drain(self) -> None:
        """Let in-flight messages finish within the grace period, then cancel the rest; the
        writer gets what is left of the grace period to flush (shutdown stays bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.worker_shutdown_grace_s
        if self._tasks:
            log.info("draining %d in-flight message(s)", len(self._tasks))
            _, pending = await asyncio.wait(
                self._tasks, timeout=self._settings.worker_shutdown_grace_s
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._writer is not None:
            self._writer.close_timeout_s = max(0.0, deadline - loop.time())


class _Lease:
    """Keeps a message invisible while it is worked on, renewing at half the timeout."""

    def __init__(self, queue: FanoutQueue, message: QueueMessage, visibility_s: int) -> None:
        self.message = message
        self._queue = queue
        self._visibility_s = visibility_s
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Lease:
        self._renewer = asyncio.create_task(self._renew())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._renewer is not None
        self._renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._renewer

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._visibility_s / 2)
            try:
                self.message = await self._queue.extend(self.message, self._visibility_s)
            except StorageUnavailableError:
                log.warning("could not renew the lease of %s", self.message.id)
