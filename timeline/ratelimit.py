"""Per-key rate limits for every mutating route (a moving window, in memory per API process)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from timeline.errors import RateLimitedError


class RateLimiter:
    """At most ``per_minute`` hits per key; ``0`` turns the limit off."""

    def __init__(self, per_minute: int, what: str) -> None:
        self._item = RateLimitItemPerMinute(per_minute) if per_minute else None
        self._what = what
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    async def check(self, key: str) -> None:
        """Count one hit by ``key`` or raise ``RateLimitedError`` with a Retry-After."""
        if self._item is None or await self._limiter.hit(self._item, key):
            return
        stats = await self._limiter.get_window_stats(self._item, key)
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        raise RateLimitedError(
            f"at most {self._item.amount} {self._what} per minute", retry_after=retry_after
        )


@dataclass(frozen=True, slots=True)
class RateLimits:
    """One limiter per kind of write: posts and other writes per user, sign-ups per address."""

    posts: RateLimiter
    writes: RateLimiter
    registrations: RateLimiter

    @classmethod
    def per_minute(cls, *, posts: int, writes: int, registrations: int) -> RateLimits:
        return cls(
            RateLimiter(posts, "posts"),
            RateLimiter(writes, "follows, unfollows and deletes"),
            RateLimiter(registrations, "registrations from one address"),
        )
