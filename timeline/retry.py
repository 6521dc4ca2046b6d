"""Backoff with full jitter, honouring the server's Retry-After when it sends one."""

from __future__ import annotations

import random

from azure.core.exceptions import HttpResponseError

ETAG_ATTEMPTS = 20
"""Rounds of read, change, write-if-unchanged on one row lost to another writer before the
request gives up with a retryable 503 (``timeline.errors.contention``): fact rows (one
follower pair, one post, one rate limit) are rarely contended; hot counters are sharded
instead (``timeline.tables.counters``)."""

MAX_EXPONENT = 64
"""Attempts past this back off as long as this one: ``2**64`` times any base in use is far
past any cap, and the exponent is clamped before the power is computed, so an outage of any
length (attempt 10,000 or 10**9) never overflows a float."""


def backoff_delay(
    attempt: int, *, base: float = 0.1, cap: float = 5.0, retry_after: float | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based)."""
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    exponent = min(max(attempt, 0), MAX_EXPONENT)
    return random.uniform(0, min(cap, base * 2.0**exponent))  # noqa: S311 - jitter, not secrets


def retry_after_of(error: BaseException) -> float | None:
    """The Retry-After of the HTTP response behind ``error`` (503 ServerBusy, 429), if any."""
    cause: BaseException | None = error
    while cause is not None:
        response = getattr(cause, "response", None)
        if isinstance(cause, HttpResponseError) and response is not None:
            value = response.headers.get("Retry-After")
            if value is not None and value.isdigit():
                return float(value)
        cause = cause.__cause__
    return None
