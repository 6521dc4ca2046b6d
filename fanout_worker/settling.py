"""How a lease ends: the outcome of a message's run, and settling it on the queue.

Every lease ends in one of four ways, decided in ``Settler._settle``: done (deleted),
continued (rewritten in place: the next page, or a delayed second pass), deferred (state not
there yet, or storage trouble: rewritten with backoff, not counted as a failure), or failed (a
real error: counted, and parked in its shard's ``fanout-<k>-poison`` with its reason at the
limit).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from functools import partial

from azure.core.exceptions import HttpResponseError
from azure.storage.queue import QueueMessage

from fanout_worker.isolation import Suspicion, marked
from fanout_worker.lease import Lease
from fanout_worker.metrics import MESSAGES, POISONED
from timeline.config import Settings
from timeline.delivery.outcomes import Continue, Done, Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import RetryableError, StorageUnavailableError, TimelineError
from timeline.model.messages import FanoutMessage, encode
from timeline.retry import MAX_EXPONENT, backoff_delay
from timeline.storage.queue import Lane

log = logging.getLogger(__name__)

_SETTLE_ATTEMPTS = 4
"""Settle attempts once the worker is stopping; before that, a settle is retried as long as
the lease holds (the lease is renewed meanwhile)."""


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now: storage answered with a retryable error (unavailable, busy or contended);
    retry with backoff."""

    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    """A real, non-retryable error: counted towards poisoning."""

    reason: str


@dataclass(frozen=True, slots=True)
class Moved:
    """The next step was sent to the other lane: delete this message (counted as a
    continuation)."""


Result = Outcome | Defer | Failed | Moved


def _label(outcome: Result) -> str:
    return "continue" if isinstance(outcome, Moved) else type(outcome).__name__.strip("_").lower()


CLEARED = {"level": 0, "solo": 0}
"""A lease that ended with an outcome clears the isolation bookkeeping."""


async def outcome_of(processor: FanoutProcessor, message: FanoutMessage) -> Result:
    """Run the message; storage trouble is a deferral, never a failure."""
    try:
        return await processor.handle(message)
    except RetryableError as error:
        return Defer(f"{error.code}: {error.message}")
    except Exception as error:
        log.exception("%s message failed", message.type)
        return Failed(f"{type(error).__name__}: {error}")


class Settler:
    """Records each lease's outcome on the queue (and the isolation marks before a suspect's
    run), retrying queue trouble while the lease holds: a queue outage is never a crash."""

    def __init__(self, settings: Settings, stopping: asyncio.Event) -> None:
        self._settings = settings
        self._delay = partial(  # the message-level retry policy
            backoff_delay, base=settings.worker_retry_base_s, cap=settings.worker_retry_cap_s
        )
        self._stopping = stopping

    async def mark(
        self, lease: Lease, message: FanoutMessage, suspicion: Suspicion
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

    async def hand_back(self, lease: Lease, message: FanoutMessage, suspicion: Suspicion) -> None:
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

    async def settle_while_leased(
        self, lease: Lease, message: FanoutMessage, outcome: Result
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
                await asyncio.sleep(self._delay(attempt))
            except HttpResponseError as error:  # the lease was lost: another worker has it
                log.warning("lease of %s lost before settling: %s", lease.message.id, error.reason)
                return

    async def _move_if_due(self, lease: Lease, outcome: Result) -> Result:
        """A next step that belongs in the other lane (a post's later pages, a second pass)
        is sent there first, once, retried while the lease holds; what is left to settle is
        deleting this one. A death (or a lost lease) between the two leaves both: the step
        runs twice, and every step is idempotent, which is the price of never losing it."""
        if not isinstance(outcome, Continue):
            return outcome
        target = lease.queue.moves(outcome.message)
        if target is None:
            return outcome
        reset = {"released": 0, "attempt": 0, "failures": 0, **CLEARED}  # a new message
        content = encode(outcome.message.model_copy(update=reset))
        delay = math.ceil(outcome.delay_s) or None
        attempt = 0
        while not lease.lost:
            try:
                await target.send_raw(content, visible_in_s=delay)
                return Moved()
            except StorageUnavailableError:
                attempt += 1
                if self._stopping.is_set() and attempt >= _SETTLE_ATTEMPTS:
                    break
                await asyncio.sleep(self._delay(attempt))
        return outcome  # not sent (lease lost, or stopping): rewritten in place, if at all

    async def _settle(
        self, queue: Lane, leased: QueueMessage, message: FanoutMessage, outcome: Result
    ) -> None:
        """The one outcome ladder: delete, rewrite for the next step, back off, or poison."""
        released = leased.dequeue_count or message.released + 1
        match outcome:
            case Done() | Moved():
                await queue.delete(leased)
            case Continue(message=following, delay_s=delay):
                reset = {"released": released, "attempt": 0, "failures": 0, **CLEARED}
                await queue.rewrite(leased, following.model_copy(update=reset), delay)
            case Defer(reason=reason):
                attempt = min(message.attempt + 1, MAX_EXPONENT)
                log.info("%s message %s deferred: %s", message.type, leased.id, reason)
                update = {"released": released, "attempt": attempt, **CLEARED}
                await queue.rewrite(leased, message.model_copy(update=update), self._delay(attempt))
            case Failed(reason=reason):
                failures = message.failures + 1
                attempt = min(message.attempt + 1, MAX_EXPONENT)
                if failures >= self._settings.worker_max_deliveries:
                    await self.poison(queue, leased, "failed", f"{failures} failures: {reason}")
                    return
                update = {
                    "released": released,
                    "attempt": attempt,
                    "failures": failures,
                    **CLEARED,
                }
                await queue.rewrite(leased, message.model_copy(update=update), self._delay(attempt))
        MESSAGES.labels(message.type, _label(outcome)).inc()

    async def poison(self, queue: Lane, message: QueueMessage, reason: str, detail: str) -> None:
        log.warning("poisoning message %s: %s", message.id, detail)
        try:
            await queue.poison(message, f"{reason}: {detail}")
        except (TimelineError, HttpResponseError):
            log.warning("could not poison %s now; it will come back", message.id)
            return
        POISONED.labels(reason).inc()
