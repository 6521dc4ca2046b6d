"""Per-user posting rate limit (a moving window, in memory per API process)."""

from __future__ import annotations

import math
import time

from limits import RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter

from timeline.errors import RateLimitedError


class PostRateLimiter:
    def __init__(self, posts_per_minute: int) -> None:
        self._item = RateLimitItemPerMinute(posts_per_minute)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    async def check(self, user_id: str) -> None:
        """Count one post by ``user_id`` or raise ``RateLimitedError`` with a Retry-After."""
        if await self._limiter.hit(self._item, user_id):
            return
        stats = await self._limiter.get_window_stats(self._item, user_id)
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        raise RateLimitedError(
            f"at most {self._item.amount} posts per minute", retry_after=retry_after
        )
