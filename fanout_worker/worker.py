"""The queue-consuming loop: lease, process, delete; poison what can never succeed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
from dataclasses import dataclass

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.queue import QueueMessage

from fanout_worker.isolation import Isolation, Suspicion, marked, triage
from fanout_worker.metrics import IN_FLIGHT, MESSAGES, POISONED, QUEUE_DEPTH, watch_limiter
from timeline.config import Settings
from timeline.delivery.outcomes import Continue, Defer, Done, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import (
    ConfigurationError,
    MalformedMessageError,
    RetryableError,
    StorageUnavailableError,
    TimelineError,
)
from timeline.model import priority
from timeline.model.messages import FanoutMessage, decode, encode, urgency
from timeline.model.priority import Priority
from timeline.retry import MAX_EXPONENT, backoff_delay
from timeline.storage.accounts import Storage, split_connection_strings
from timeline.storage.names import LEGACY_SHARD, TIMELINES, poison_queue_name
from timeline.storage.queue import FanoutQueue, FanoutQueues, Lane
from timeline.storage.writer import PartitionWriter

log = logging.getLogger(__name__)

MAX_RECEIVE = 32
"""Azure Storage Queues lease at most 32 messages per request."""
BACKGROUND_SHARE = 0.75
"""Of the places for messages in flight, what background work may hold: the rest is kept
for user-facing work, which never waits for a backlog of backfills to finish."""
MESSAGES_PER_REQUEST = 4
"""Background messages in flight per table request the limiter lets out: enough to keep it
busy; more would only wait in the limiter while their leases cost renewals (and a death
touches more of them)."""
_SETTLE_ATTEMPTS = 4
"""Settle attempts once the worker is stopping; before that, a settle is retried as long as
the lease holds (the lease is renewed meanwhile)."""


class Worker:
    """Consumes the queue shards with at most ``worker_concurrency`` messages in flight.

    Several receivers lease up to 32 messages each; concurrency is capped by counting
    in-flight messages plus leases being requested. Half the receivers serve the user-facing
    queues, half the background queues; background work may hold at most
    ``BACKGROUND_SHARE`` of the places, so a fresh post always finds room, and the
    background is never starved (its receivers never wait for the user-facing queues). A
    message runs at its ``urgency``: the writer and the storage limiter serve ``HIGH``
    first. Timeline writes of all messages meet in one ``PartitionWriter``, which coalesces
    them per partition into EGT batches; every table call waits for a place in the adaptive
    limiter (``timeline.storage.limiter``).

    Every lease ends in one of four ways, decided in ``_settle``: done (deleted), continued
    (rewritten in place: the next page, or a delayed second pass), deferred (state not there
    yet, or storage trouble: rewritten with backoff, not counted as a failure), or failed (a
    real error: counted, and parked in ``fanout-poison`` with its reason at the limit). A lease
    that ends in a crash is noticed from the queue's dequeue count, and the message is then
    run in isolation before it is blamed (``fanout_worker.isolation``).
    """

    def __init__(self, settings: Settings, connection_string: str) -> None:
        self._settings = settings
        self._connection_string = connection_string
        self._policy = settings.retry_policy()
        self._limiter = settings.worker_limiter(len(split_connection_strings(connection_string)))
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._reserved = [0 for _ in Priority]
        self._capacity = asyncio.Condition()
        self._notifiers: set[asyncio.Future[None]] = set()
        self._isolation = Isolation(on_idle=self._notify)

    def run(self) -> None:
        asyncio.run(self.async_run(install_signal_handlers=True))

    def stop(self) -> None:
        """Stop receiving (safe to call from a signal handler on the loop); then drain."""
        self._stopping.set()
        self._isolation.stop()
        self._notify()

    async def async_run(self, *, install_signal_handlers: bool = False) -> None:
        if install_signal_handlers:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        settings = self._settings
        watch_limiter(self._limiter)
        options = settings.storage_options(limiter=self._limiter)
        async with Storage(self._connection_string, options) as storage:
            writer = PartitionWriter(
                storage,
                TIMELINES,
                linger_s=settings.worker_linger_s,
                max_in_flight=settings.worker_write_concurrency,
                max_buffered=settings.worker_max_buffered,
            )
            shards = await self._shards(storage)
            processor = FanoutProcessor.on(
                storage,
                writer,
                follower_page_size=settings.worker_follower_page_size,
                timing=settings.fanout_timing(),
                timeline_cap=settings.max_timeline_items,
                hybrid=settings.hybrid(FanoutQueues(storage)),
            )
            await writer.start()
            try:
                if shards:
                    await self._consume(shards, processor)
            finally:
                await self._shutdown(writer)
        log.info("fan-out worker stopped")

    async def _shards(self, storage: Storage) -> list[FanoutQueue]:
        """Every queue shard (and the single queue of a deployment from before shards, while
        it exists), once the placement has been read; empty when asked to stop first."""
        failures = 0
        while not self._stopping.is_set():
            try:
                placement = await storage.confirmed_placement()
                shards = [
                    FanoutQueue(storage, shard) for shard in self._assigned(placement.queue_shards)
                ]
                if await storage.legacy_queue_exists():
                    shards.append(FanoutQueue(storage, LEGACY_SHARD))
                return shards
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

    async def _consume(self, shards: list[FanoutQueue], processor: FanoutProcessor) -> None:
        log.info(
            "fan-out worker started: %d queue shard(s), %d messages in flight, "
            "%d write requests in flight",
            len(shards),
            self._settings.worker_concurrency,
            self._settings.worker_write_concurrency,
        )
        lanes = {
            level: [s.lanes[level] for s in shards if level < len(s.lanes)] for level in Priority
        }
        sampler = asyncio.create_task(self._sample_depth(shards))
        high = max(1, self._settings.worker_receivers // 2)
        low = max(1, self._settings.worker_receivers - high)  # each priority has its own
        try:
            async with asyncio.TaskGroup() as receivers:
                for index in range(high + low):
                    level = Priority.HIGH if index < high else Priority.LOW
                    receivers.create_task(self._receive(lanes[level], processor, index, level))
        finally:
            sampler.cancel()

    async def _shutdown(self, writer: PartitionWriter) -> None:
        """Stop in this order, within the grace period: receivers have returned (no new
        leases); in-flight messages finish or are cancelled (their leases expire and they come
        back); then the writer flushes what is left of the grace period and drops the rest
        (those rows belong to messages that were never deleted); storage closes last."""
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
        await writer.close(max(0.0, deadline - loop.time()))

    async def _receive(
        self, shards: list[Lane], processor: FanoutProcessor, first: int, level: Priority
    ) -> None:
        """One receiver of one priority: lease as many messages as there is room for, start
        each one.

        Receivers take the shards' lanes in turn, each from its own starting shard, so every
        shard is asked as often as any other; a receiver idles only after a whole round of
        empty lanes."""
        failures = empty = 0
        turn = first
        while not self._stopping.is_set():
            count = await self._reserve(level)
            if not count or not shards:
                await self._release(count, level)
                return
            queue, turn = shards[turn % len(shards)], turn + 1
            try:
                messages = await queue.receive(count, self._settings.worker_visibility_timeout_s)
                failures = 0
            except StorageUnavailableError:
                failures += 1
                messages = []
            except ResourceNotFoundError:
                if queue.shard != LEGACY_SHARD:
                    raise
                log.info("the legacy fanout queue is gone; consuming the shards only")
                with contextlib.suppress(ValueError):
                    shards.remove(queue)
                messages = []
            finally:
                await self._release(count, level)
            for message in messages:
                self._start(queue, processor, message)
            empty = 0 if messages else empty + 1
            if failures:
                await self._sleep(backoff_delay(failures, base=0.2, cap=10))
            elif empty >= len(shards):
                empty = 0
                await self._sleep(self._settings.worker_idle_sleep_s)

    async def _reserve(self, level: Priority) -> int:
        """Wait for room, then reserve up to 32 places for the messages about to be leased."""
        async with self._capacity:
            await self._capacity.wait_for(lambda: self._room(level) > 0 or self._stopping.is_set())
            if self._stopping.is_set():
                return 0
            count = min(MAX_RECEIVE, self._room(level))
            self._reserved[level] += count
            return count

    async def _release(self, count: int, level: Priority) -> None:
        async with self._capacity:
            self._reserved[level] -= count
            self._capacity.notify_all()

    def _room(self, level: Priority) -> int:
        if self._isolation.busy:  # suspects wait or run: lease nothing new meanwhile
            return 0
        room = self._settings.worker_concurrency - len(self._tasks) - sum(self._reserved)
        if level == Priority.HIGH:
            return room
        return min(room, self._background_cap() - len(self._background) - self._reserved[level])

    def _background_cap(self) -> int:
        """Background messages in flight: a few per table request storage serves now (the
        limiter), at least one receive's worth, at most ``BACKGROUND_SHARE`` of all. A
        backfill or a later page gains nothing from company (its rows go to partitions of
        its own), so more would only wait, costing lease renewals; posts and deletes keep
        the whole concurrency, since many in flight is what fills their batches."""
        served = MESSAGES_PER_REQUEST * int(self._limiter.limit)
        share = int(self._settings.worker_concurrency * BACKGROUND_SHARE)
        return max(1, min(share, max(MAX_RECEIVE, served)))

    async def _finished(self) -> None:
        async with self._capacity:
            self._capacity.notify_all()

    def _start(self, queue: Lane, processor: FanoutProcessor, message: QueueMessage) -> None:
        task = asyncio.create_task(self._process(queue, processor, message))
        self._tasks.add(task)
        if queue.level == Priority.LOW:
            self._background.add(task)
        IN_FLIGHT.inc()
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        """Release the message's place (arq-style, from the task's own callback)."""
        self._tasks.discard(task)
        self._background.discard(task)
        IN_FLIGHT.dec()
        if not task.cancelled() and task.exception() is not None:
            log.error("message task failed", exc_info=task.exception())
        self._notify()

    def _notify(self) -> None:
        """Wake receivers waiting for room, from sync code (callbacks, signal handlers)."""
        notifier = asyncio.ensure_future(self._finished())
        self._notifiers.add(notifier)
        notifier.add_done_callback(self._notifiers.discard)

    async def _process(self, queue: Lane, processor: FanoutProcessor, leased: QueueMessage) -> None:
        try:
            message = decode(leased.content)
        except MalformedMessageError as error:
            await self._poison(queue, leased, "malformed", error.message)
            return
        dequeue_count = leased.dequeue_count or 1
        suspicion = triage(message, dequeue_count, self._settings.worker_max_crashes)
        if suspicion.verdict is not None:
            await self._poison(queue, leased, "crashed", suspicion.verdict)
            return
        lease = _Lease(queue, leased, self._settings.worker_visibility_timeout_s)
        async with lease, self._isolation.admit(suspicion.level) as admitted:
            if not admitted:
                await self._hand_back(lease, message, suspicion)
                return
            if suspicion.level:
                marked_message = await self._mark(lease, message, suspicion)
                if marked_message is None:
                    return
                message = marked_message
            with priority.running_as(urgency(message)):
                outcome = await _outcome_of(processor, message)
            await self._settle_while_leased(lease, message, outcome)

    async def _mark(
        self, lease: _Lease, message: FanoutMessage, suspicion: Suspicion
    ) -> FanoutMessage | None:
        """Record the isolated run about to start (renewing the lease); None if that failed:
        the message then comes back unchanged, and its next lease escalates no further."""
        replacement = marked(message, suspicion, lease.message.dequeue_count or 1)
        log.info("running %s message %s in isolation at level %d (%d solo crashes)",
                 message.type, lease.message.id, suspicion.level, suspicion.solo)  # fmt: skip
        try:
            async with lease.held():
                lease.message = await lease.queue.mark(
                    lease.message, replacement, self._settings.worker_visibility_timeout_s
                )
        except (StorageUnavailableError, HttpResponseError) as error:
            log.warning("could not mark %s for isolation: %s", lease.message.id, error)
            return None
        return replacement

    async def _hand_back(self, lease: _Lease, message: FanoutMessage, suspicion: Suspicion) -> None:
        """Stopping: make a message that never started visible again at once, as if this
        lease had not happened: a normal one is released (not a crash); a suspect keeps the
        one unexplained lease that made it one, so its next lease judges it exactly as this
        one did (no escalation, no solo crash for a run that never started)."""
        leased = lease.message
        dequeue_count = leased.dequeue_count or message.released + 1
        released = dequeue_count - 1 if suspicion.level else dequeue_count
        try:
            async with lease.held():
                update = {"released": released}
                await lease.queue.rewrite(leased, message.model_copy(update=update), 0)
        except (StorageUnavailableError, HttpResponseError):
            log.info("could not hand back %s; its lease will expire", leased.id)

    async def _settle_while_leased(
        self, lease: _Lease, message: FanoutMessage, outcome: _Result
    ) -> None:
        """Record the outcome. A queue outage at this step is not a crash: the lease is kept
        renewed and the settle retried, with capped backoff, until it succeeds, the lease is
        lost, or the worker is stopping (then a few attempts)."""
        outcome = await self._move_if_due(lease, outcome)
        attempt = 0
        while not lease.lost:
            try:
                async with lease.held():
                    await self._settle(lease.queue, lease.message, message, outcome)
                return
            except StorageUnavailableError:
                attempt += 1
                if self._stopping.is_set() and attempt >= _SETTLE_ATTEMPTS:
                    log.warning("could not settle %s message %s; its lease will expire",
                                message.type, lease.message.id)  # fmt: skip
                    return
                await asyncio.sleep(self._policy.delay(attempt))
            except HttpResponseError as error:  # the lease was lost: another worker has it
                log.warning("lease of %s lost before settling: %s", lease.message.id, error.reason)
                return

    async def _move_if_due(self, lease: _Lease, outcome: _Result) -> _Result:
        """A next step that belongs in the other lane (a post's later pages, a second pass)
        is sent there first, once, retried while the lease holds; what is left to settle is
        deleting this one. A death (or a lost lease) between the two leaves both: the step
        runs twice, and every step is idempotent, which is the price of never losing it."""
        if not isinstance(outcome, Continue):
            return outcome
        target = lease.queue.moves(outcome.message)
        if target is None:
            return outcome
        reset = {"released": 0, "attempt": 0, "failures": 0, **_CLEARED}  # a new message
        content = encode(outcome.message.model_copy(update=reset))
        delay = math.ceil(outcome.delay_s) or None
        attempt = 0
        while not lease.lost:
            try:
                await target.send_raw(content, visible_in_s=delay)
                return _Moved()
            except StorageUnavailableError:
                attempt += 1
                if self._stopping.is_set() and attempt >= _SETTLE_ATTEMPTS:
                    break
                await asyncio.sleep(self._policy.delay(attempt))
        return outcome  # not sent (lease lost, or stopping): rewritten in place, if at all

    async def _settle(
        self, queue: Lane, leased: QueueMessage, message: FanoutMessage, outcome: _Result
    ) -> None:
        """The one outcome ladder: delete, rewrite for the next step, back off, or poison."""
        released = leased.dequeue_count or message.released + 1
        match outcome:
            case Done() | _Moved():
                await queue.delete(leased)
            case Continue(message=following, delay_s=delay):
                reset = {"released": released, "attempt": 0, "failures": 0, **_CLEARED}
                await queue.rewrite(leased, following.model_copy(update=reset), delay)
            case Defer(reason=reason):
                attempt = min(message.attempt + 1, MAX_EXPONENT)
                log.info("%s message %s deferred: %s", message.type, leased.id, reason)
                update = {"released": released, "attempt": attempt, **_CLEARED}
                await queue.rewrite(
                    leased, message.model_copy(update=update), self._policy.delay(attempt)
                )
            case _Failed(reason=reason):
                failures = message.failures + 1
                attempt = min(message.attempt + 1, MAX_EXPONENT)
                if failures >= self._settings.worker_max_deliveries:
                    await self._poison(queue, leased, "failed", f"{failures} failures: {reason}")
                    return
                update = {
                    "released": released,
                    "attempt": attempt,
                    "failures": failures,
                    **_CLEARED,
                }
                await queue.rewrite(
                    leased, message.model_copy(update=update), self._policy.delay(attempt)
                )
        MESSAGES.labels(message.type, _label(outcome)).inc()

    async def _poison(self, queue: Lane, message: QueueMessage, reason: str, detail: str) -> None:
        log.warning("poisoning message %s: %s", message.id, detail)
        try:
            await queue.poison(message, f"{reason}: {detail}")
        except (TimelineError, HttpResponseError):
            log.warning("could not poison %s now; it will come back", message.id)
            return
        POISONED.labels(reason).inc()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when asked to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _sample_depth(self, shards: list[FanoutQueue]) -> None:
        while True:
            try:
                for queue in shards:
                    for lane in queue.lanes:
                        QUEUE_DEPTH.labels(lane.name).set(await lane.depth())
                    poison = await queue.poison_depth()
                    QUEUE_DEPTH.labels(poison_queue_name(queue.shard)).set(poison)
            except Exception:  # a sampler must never die
                log.warning("could not sample queue depths", exc_info=True)
            await asyncio.sleep(5)


@dataclass(frozen=True, slots=True)
class _Failed:
    """A real, non-retryable error: counted towards poisoning."""

    reason: str


@dataclass(frozen=True, slots=True)
class _Moved:
    """The next step was sent to the other lane: delete this message (counted as a
    continuation)."""


_Result = Outcome | _Failed | _Moved


def _label(outcome: _Result) -> str:
    return "continue" if isinstance(outcome, _Moved) else type(outcome).__name__.strip("_").lower()


_CLEARED = {"level": 0, "solo": 0}
"""A lease that ended with an outcome clears the isolation bookkeeping."""


async def _outcome_of(processor: FanoutProcessor, message: FanoutMessage) -> _Result:
    """Run the message; storage trouble is a deferral, never a failure."""
    try:
        return await processor.handle(message)
    except RetryableError as error:
        return Defer(f"{error.code}: {error.message}")
    except Exception as error:
        log.exception("%s message failed", message.type)
        return _Failed(f"{type(error).__name__}: {error}")


class _Lease:
    """Keeps a message invisible while it is worked on, renewing at half the timeout.

    Stopping waits for a renewal in flight (bounded by the storage timeout) rather than
    cancelling it: a cancelled renewal may have changed the pop receipt on the server. Any
    other call with the pop receipt holds ``held()``, so it never races a renewal."""

    def __init__(self, queue: Lane, message: QueueMessage, visibility_s: int) -> None:
        self.message = message
        self.lost = False
        self.queue = queue
        self._lock = asyncio.Lock()
        self._visibility_s = visibility_s
        self._stop = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Lease:
        self._renewer = asyncio.create_task(self._renew())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._renewer is not None
        self._stop.set()
        await self._renewer

    def held(self) -> asyncio.Lock:
        """Hold while calling the queue with this lease's pop receipt."""
        return self._lock

    async def _renew(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._visibility_s / 2)
                return
            try:
                async with self._lock:
                    self.message = await self.queue.extend(self.message, self._visibility_s)
            except StorageUnavailableError:
                log.warning("could not renew the lease of %s", self.message.id)
            except HttpResponseError as error:
                log.warning("lost the lease of %s: %s", self.message.id, error.reason)
                self.lost = True
                return
