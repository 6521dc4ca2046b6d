"""The queue-consuming loop: lease, process, delete; poison what can never succeed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from azure.storage.queue import QueueMessage

from fanout_worker.idle import Polls
from fanout_worker.intake import Intake
from fanout_worker.isolation import Isolation, triage
from fanout_worker.lease import Lease
from fanout_worker.metrics import sample_depth, watch_limiter
from fanout_worker.settling import Settler, outcome_of
from fanout_worker.sweeper import Sweeper
from timeline.config import Settings
from timeline.delivery.batching.writer import PartitionWriter
from timeline.delivery.dormancy import Dormancy
from timeline.delivery.processor import FanoutProcessor, worker_writer
from timeline.errors import ConfigurationError, MalformedMessageError, StorageUnavailableError
from timeline.model import priority
from timeline.model.messages import decode, urgency
from timeline.model.priority import Priority
from timeline.retry import backoff_delay
from timeline.storage.accounts import Storage, split_connection_strings
from timeline.storage.queue import FanoutQueue, Lane

log = logging.getLogger(__name__)


class Worker:
    """Consumes the queue shards with at most ``worker_concurrency`` messages in flight.

    Several receivers lease up to 32 messages each (``fanout_worker.intake``, which also
    caps concurrency). Half the receivers serve the user-facing queues, half the background
    queues; background work may hold only part of the places, so a fresh post always finds
    room. A message runs at its ``urgency``: the writer and the storage limiter serve
    ``HIGH`` first. Timeline writes of all messages meet in one ``PartitionWriter``, which
    coalesces them per partition into EGT batches; every table call waits for a place in the
    adaptive limiter (``timeline.storage.flow.limiter``).

    Every lease ends in one of four ways, decided in ``fanout_worker.settling``: done,
    continued, deferred, or failed. A lease that ends in a crash is noticed from the queue's
    dequeue count, and the message is then run in isolation before it is blamed
    (``fanout_worker.isolation``).
    """

    def __init__(self, settings: Settings, connection_string: str) -> None:
        self._settings = settings
        self._connection_string = connection_string
        self._limiter = settings.worker_limiter(len(split_connection_strings(connection_string)))
        self._stopping = asyncio.Event()
        self._isolation = Isolation(on_idle=lambda: self._intake.notify())
        self._intake = Intake(settings, self._limiter, self._isolation, self._stopping, self._sleep)
        self._settler = Settler(settings, self._stopping)

    @property
    def polls(self) -> Polls:
        """What this worker's receivers did so far (its ``fanout_receives_total`` share)."""
        return self._intake.pace.polls

    def run(self) -> None:
        asyncio.run(self.async_run(install_signal_handlers=True))

    def stop(self) -> None:
        """Stop receiving (safe to call from a signal handler on the loop); then drain."""
        self._stopping.set()
        self._isolation.stop()
        self._intake.notify()

    async def async_run(
        self, *, install_signal_handlers: bool = False, burst: bool = False
    ) -> None:
        """Consume until ``stop``; with ``burst``, stop by itself once every lane is empty
        and no message is in flight (arq's burst mode: tests wait on it, never on a guess)."""
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        settings = self._settings
        watch_limiter(self._limiter)
        options = settings.storage_options(limiter=self._limiter)
        async with Storage(self._connection_string, options) as storage:
            writer = worker_writer(storage, settings)
            shards = await self._shards(storage)
            processor = FanoutProcessor.configured(storage, writer, settings)
            await writer.start()
            sweeps = self._start_sweeps(storage)
            try:
                if shards:
                    await self._consume(shards, processor, burst)
            finally:
                if sweeps is not None:
                    sweeps.cancel()
                await self._shutdown(writer)
        log.info("fan-out worker stopped")

    def _start_sweeps(self, storage: Storage) -> asyncio.Task[None] | None:
        """The expiry sweep in the background (``fanout_worker.sweeper``), unless turned off."""
        interval = self._settings.expiry_sweep_interval_s
        if not interval:
            return None
        settings = self._settings
        dormancy = Dormancy(
            storage,
            settings.inactivity(),
            flag_window_s=settings.fanout_timing().write_deadline_s,
        )
        sweeper = Sweeper(storage, dormancy=dormancy)
        return asyncio.create_task(sweeper.run(self._stopping, interval))

    async def _shards(self, storage: Storage) -> list[FanoutQueue]:
        """Every queue shard this worker consumes, once the placement has been read; empty
        when asked to stop first."""
        failures = 0
        while not self._stopping.is_set():
            try:
                placement = await storage.confirmed_placement()
                return [
                    FanoutQueue(storage, shard) for shard in self._assigned(placement.queue_shards)
                ]
            except StorageUnavailableError as error:
                failures += 1
                log.warning("waiting for the storage placement: %s", error.message)
                await self._sleep(backoff_delay(failures, base=0.2, cap=5))
        return []

    def _assigned(self, queue_shards: int) -> list[int]:
        """The shards ``TIMELINE_WORKER_SHARDS`` names (all by default)."""
        wanted = self._settings.worker_shards
        if wanted is None:
            return list(range(queue_shards))
        if not wanted or max(wanted) >= queue_shards or min(wanted) < 0:
            raise ConfigurationError(
                f"TIMELINE_WORKER_SHARDS names shards outside 0-{queue_shards - 1}: {wanted}"
            )
        return list(wanted)

    async def _consume(
        self, shards: list[FanoutQueue], processor: FanoutProcessor, burst: bool
    ) -> None:
        log.info(
            "fan-out worker started: %d queue shard(s), %d messages in flight, "
            "%d write requests in flight",
            len(shards),
            self._settings.worker_concurrency,
            self._settings.worker_write_concurrency,
        )
        lanes = {level: [s.lanes[level] for s in shards] for level in Priority}

        async def start(queue: Lane, message: QueueMessage) -> None:
            await self._process(queue, processor, message)

        sampler = asyncio.create_task(sample_depth(shards))
        every_lane = [lane for level in Priority for lane in lanes[level]]
        watcher = asyncio.create_task(self._stop_when_drained(every_lane)) if burst else None
        high = max(1, self._settings.worker_receivers // 2)
        low = max(1, self._settings.worker_receivers - high)  # each priority has its own
        try:
            async with asyncio.TaskGroup() as receivers:
                for index in range(high + low):
                    level = Priority.HIGH if index < high else Priority.LOW
                    lookout = index in (0, high)  # the first of each priority
                    receivers.create_task(
                        self._intake.receive(lanes[level], index, level, start, lookout=lookout)
                    )
        finally:
            sampler.cancel()
            if watcher is not None:
                watcher.cancel()

    async def _stop_when_drained(self, lanes: list[Lane]) -> None:
        """Burst mode: stop once the lanes are empty and nothing is in flight."""
        while not await self._intake.drained(lanes):
            await self._sleep(self._settings.worker_idle_sleep_s)
        self.stop()

    async def _shutdown(self, writer: PartitionWriter) -> None:
        """Stop in this order, within the grace period: receivers have returned (no new
        leases); in-flight messages finish or are cancelled (their leases expire and they come
        back); then the writer flushes what is left of the grace period and drops the rest
        (those rows belong to messages that were never deleted); storage closes last."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.worker_shutdown_grace_s
        tasks = self._intake.in_flight
        if tasks:
            log.info("draining %d in-flight message(s)", len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self._settings.worker_shutdown_grace_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await writer.close(max(0.0, deadline - loop.time()))

    async def _process(self, queue: Lane, processor: FanoutProcessor, leased: QueueMessage) -> None:
        settler = self._settler
        try:
            message = decode(leased.content)
        except MalformedMessageError as error:
            await settler.poison(queue, leased, "malformed", error.message)
            return
        dequeue_count = leased.dequeue_count or 1
        suspicion = triage(message, dequeue_count, self._settings.worker_max_crashes)
        if suspicion.verdict is not None:
            await settler.poison(queue, leased, "crashed", suspicion.verdict)
            return
        lease = Lease(queue, leased, self._settings.worker_visibility_timeout_s)
        async with lease, self._isolation.admit(suspicion.level) as admitted:
            if not admitted:
                await settler.hand_back(lease, message, suspicion)
                return
            if suspicion.level:
                marked_message = await settler.mark(lease, message, suspicion)
                if marked_message is None:
                    return
                message = marked_message
            with priority.running_as(urgency(message)):
                outcome = await outcome_of(processor, message)
            await settler.settle_while_leased(lease, message, outcome)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
