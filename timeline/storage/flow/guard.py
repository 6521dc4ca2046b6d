"""The guard around every storage call: a time bound, outages turned into
``StorageUnavailableError``, the placement renewed first, and a place in the limiter."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar

import aiohttp
from azure.core.exceptions import HttpResponseError, ServiceRequestError, ServiceResponseError

from timeline.errors import StorageUnavailableError
from timeline.metrics import STORAGE_REQUESTS, STORAGE_UNAVAILABLE
from timeline.retry import retry_after_of
from timeline.storage.flow.limiter import AdaptiveLimiter, Outcome

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_UNAVAILABLE_ERRORS = (
    TimeoutError,
    ServiceRequestError,
    ServiceResponseError,
    aiohttp.ClientError,
    ConnectionError,
)


_HOLDING: ContextVar[bool] = ContextVar("holding_a_limiter_place", default=False)
"""Set while a call holds a place in the limiter, so a nested call cannot deadlock on it."""

_DEADLINE: ContextVar[float | None] = ContextVar("storage_call_deadline", default=None)
"""Set by ``deadline``: calls made in its scope are sent by then or not at all."""

Renew = Callable[[], Awaitable[None]]


@contextmanager
def deadline(not_after: float) -> Iterator[None]:
    """Every storage call made inside (retries, ETag loops and counter-shard conflicts
    included) that has not started by ``not_after`` (``time.monotonic``; its place in the
    limiter comes first) is refused with a retryable ``StorageUnavailableError``; one that
    has ends within its timeout, the placement's renewal before it included."""
    token = _DEADLINE.set(not_after)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def is_retryable(error: BaseException) -> bool:
    """True for failures that say nothing about the request itself: outages, throttling."""
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return True
    return isinstance(error, HttpResponseError) and (
        error.status_code is None or error.status_code in _RETRYABLE_STATUS
    )


@asynccontextmanager
async def guarded(
    timeout_s: float,
    renew: Renew | None,
    limiter: AdaptiveLimiter | None,
    kind: str,
    not_after: float | None = None,
) -> AsyncIterator[None]:
    """``Storage.guard``'s body: only calls that ``renew`` wait for a place in ``limiter``
    (control calls pass), and a call made while this task holds a place does not wait. A
    call that has its place only after ``not_after`` (``time.monotonic``) is not sent."""
    limiter = limiter if renew is not None and not _HOLDING.get() else None
    if limiter is None:
        _refuse_if_past(not_after)
        async with _bounded(timeout_s, renew, outcome=None):
            yield
        return
    holding = _HOLDING.set(True)  # a call made inside this one must not wait for a place
    try:
        async with limiter.slot(kind) as outcome:
            _refuse_if_past(not_after)
            async with _bounded(timeout_s, renew, outcome):
                yield
    finally:
        _HOLDING.reset(holding)


def _refuse_if_past(not_after: float | None) -> None:
    """A call whose reason is older than its deadline allows is not sent (retryable)."""
    scoped = _DEADLINE.get()
    if scoped is not None:
        not_after = scoped if not_after is None else min(not_after, scoped)
    if not_after is not None and time.monotonic() > not_after:
        raise StorageUnavailableError(
            "the call's deadline passed before it was sent", retry_after=0
        )


@asynccontextmanager
async def _bounded(
    timeout_s: float, renew: Renew | None, outcome: Outcome | None
) -> AsyncIterator[None]:
    STORAGE_REQUESTS.inc()
    try:
        async with asyncio.timeout(timeout_s):
            if renew is not None:
                await renew()
            yield
    except asyncio.CancelledError:
        if outcome is not None:
            outcome.cancelled = True
        raise
    except Exception as error:
        if not is_retryable(error):
            raise
        if outcome is not None:
            outcome.congested, outcome.retry_after = True, retry_after_of(error)
        STORAGE_UNAVAILABLE.inc()
        log.warning("storage unavailable: %s", type(error).__name__)
        raise StorageUnavailableError(
            "storage is unavailable, try again shortly", retry_after=2
        ) from error
