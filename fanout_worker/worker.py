"""The queue-consuming loop: lease, process, delete; poison what can never succeed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal

from azure.storage.queue import QueueMessage

from fanout_worker.metrics import IN_FLIGHT, MESSAGES, POISONED
from timeline.config import Settings
from timeline.errors import MalformedMessageError, StorageUnavailableError, TimelineError
from timeline.fanout import FanoutProcessor
from timeline.messages import decode
from timeline.queue import FanoutQueue
from timeline.repositories import Repositories
from timeline.storage import Storage

log = logging.getLogger(__name__)

MAX_RECEIVE = 32
"""Azure Storage Queues lease at most 32 messages per request."""


class Worker:
    """Consumes ``fanout`` with at most ``worker_concurrency`` messages in flight.

    Concurrency is capped by counting in-flight tasks; receiving waits for a free one.
    At-least-once: a message is deleted only after every write it caused succeeded; a message
    that fails comes back when its lease runs out, and after ``worker_max_deliveries`` tries it
    is parked in ``fanout-poison``. SIGTERM stops receiving, drains, then cancels.
    """

    def __init__(self, settings: Settings, connection_string: str) -> None:
        self._settings = settings
        self._connection_string = connection_string
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._queue: FanoutQueue | None = None
        self._processor: FanoutProcessor | None = None

    def run(self) -> None:
        asyncio.run(self.async_run(install_signal_handlers=True))

    def stop(self) -> None:
        self._stopping.set()

    async def async_run(self, *, install_signal_handlers: bool = False) -> None:
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        settings = self._settings
        async with Storage(self._connection_string, settings.storage_options()) as storage:
            self._queue = FanoutQueue(storage)
            self._processor = FanoutProcessor(
                Repositories.on(storage), write_concurrency=settings.worker_write_concurrency
            )
            log.info("fan-out worker started (concurrency %d)", settings.worker_concurrency)
            try:
                await self._consume()
            finally:
                await self._drain()
        log.info("fan-out worker stopped")

    async def _consume(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            await self._until_capacity()
            free = min(MAX_RECEIVE, self._settings.worker_concurrency - len(self._tasks))
            try:
                messages = await self._leased_queue().receive(
                    free, self._settings.worker_visibility_timeout_s
                )
                failures = 0
            except StorageUnavailableError:
                failures += 1
                await self._sleep(_backoff(failures))
                continue
            for message in messages:
                self._start(message)
            if not messages:
                await self._sleep(self._settings.worker_idle_sleep_s)

    async def _until_capacity(self) -> None:
        while len(self._tasks) >= self._settings.worker_concurrency:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)

    def _start(self, message: QueueMessage) -> None:
        task = asyncio.create_task(self._process(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _process(self, message: QueueMessage) -> None:
        IN_FLIGHT.inc()
        try:
            await self._handle(message)
        finally:
            IN_FLIGHT.dec()

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

    async def _drain(self) -> None:
        """Let in-flight messages finish within the grace period, then cancel the rest."""
        if not self._tasks:
            return
        log.info("draining %d in-flight message(s)", len(self._tasks))
        _, pending = await asyncio.wait(self._tasks, timeout=self._settings.worker_shutdown_grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


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


def _backoff(failures: int, base: float = 0.2, cap: float = 10.0) -> float:
    """Full-jitter exponential backoff."""
    return random.uniform(0, min(cap, base * 2**failures))  # noqa: S311 - jitter, not secrets
