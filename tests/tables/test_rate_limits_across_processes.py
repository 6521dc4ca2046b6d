"""Rate limits are counted in storage, so they hold across API processes and hosts."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from azure.data.tables.aio import TableClient

from tests.conftest import api_client, make_settings, unique
from tests.faults import StorageFront
from tests.helpers import Api, bearer, error_of
from timeline.config import Settings
from timeline.errors import RateLimitedError, StorageUnavailableError
from timeline.storage.accounts import Storage
from timeline.storage.names import EXPIRIES, RATE_LIMITS
from timeline.tables.ratelimits import RateLimits, TableWindowStorage
from timeline.tools.azurite import Azurite


async def test_a_rate_limit_holds_across_two_api_processes(
    settings: Settings, storage: Storage
) -> None:
    """Two app instances (each with its own storage clients, as two processes have) share
    one user's post limit: whichever one the 4th post hits refuses it."""
    limited = make_settings(settings.connection_string(), settings.data_dir, posts_per_minute=3)
    async with api_client(limited) as first, api_client(limited) as second:
        user = unique()
        token = await Api(first).register(user)
        for client, text in ((first, "one"), (second, "two"), (first, "three")):
            await Api(client).post(user, token, text)
        for client in (second, first):
            response = await client.post(
                f"/users/{user}/posts", json={"text": "four"}, headers=bearer(token)
            )
            assert await error_of(response, 429) == "rate_limited"
            assert 1 <= int(response.headers["Retry-After"]) <= 60
        assert (await Api(second).profile(user))["posts"] == 3


async def test_concurrent_hits_through_two_limiters_are_counted_exactly(
    settings: Settings, storage: Storage
) -> None:
    """20 concurrent hits on one key with a limit of 10, half through a second ``Storage``
    (another process's clients): exactly 10 pass, the rest get a Retry-After."""
    async with Storage(settings.connection_string(), settings.storage_options()) as other:
        limiters = [
            RateLimits.per_minute(opened, posts=10, writes=0, registrations=0).posts
            for opened in (storage, other)
        ]
        user = unique()
        outcomes = await asyncio.gather(
            *(limiters[i % 2].check(user) for i in range(20)), return_exceptions=True
        )
    assert outcomes.count(None) == 10
    refused = [outcome for outcome in outcomes if outcome is not None]
    assert all(isinstance(error, RateLimitedError) for error in refused), refused
    assert all(
        1 <= error.retry_after <= 60 for error in refused if isinstance(error, RateLimitedError)
    )


def _count_routed(storage: Storage, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the table requests ``storage`` routes: every one goes through these two."""
    routed: Counter[str] = Counter()

    def counting(name: str, route: Callable[[str, str], TableClient]) -> Any:
        def routed_call(table: str, partition_key: str) -> TableClient:
            assert table in (RATE_LIMITS, EXPIRIES)
            routed[name if table == RATE_LIMITS else "filed"] += 1
            return route(table, partition_key)

        return routed_call

    monkeypatch.setattr(storage, "reader", counting("reads", storage.reader))
    monkeypatch.setattr(storage, "table", counting("writes", storage.table))
    return routed


async def test_what_a_check_costs(
    settings: Settings, storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off: nothing. Passed: one read and one conditional write (and, opening a window, its
    filing in ``expiries``). Refused: one more read."""
    async with Storage(settings.connection_string(), settings.storage_options()) as own:
        routed = _count_routed(own, monkeypatch)
        limits = RateLimits.per_minute(own, posts=0, writes=1, registrations=0)
        user = unique()
        await limits.posts.check(user)
        assert routed == Counter()
        await limits.writes.check(user)
        assert routed == Counter(reads=1, writes=1, filed=1)
        with pytest.raises(RateLimitedError):
            await limits.writes.check(user)
        assert routed == Counter(reads=3, writes=2, filed=1)


async def test_limiters_and_their_limits_keep_separate_counts(storage: Storage) -> None:
    user = unique()
    one = RateLimits.per_minute(storage, posts=1, writes=1, registrations=0)
    await one.posts.check(user)
    await one.writes.check(user)  # the same key, another limiter
    await RateLimits.per_minute(storage, posts=2, writes=0, registrations=0).posts.check(user)
    with pytest.raises(RateLimitedError):
        await one.posts.check(user)


async def test_an_outage_is_a_retryable_storage_error(
    front: StorageFront, fronted: Storage
) -> None:
    limiter = RateLimits.per_minute(fronted, posts=5, writes=0, registrations=0).posts
    front.lose_writes.add(RATE_LIMITS)
    with pytest.raises(StorageUnavailableError):
        await limiter.check(unique())


async def test_clear_and_reset_forget_counts(private_azurite: Azurite) -> None:
    async with Storage(private_azurite.connection_string) as own:
        await own.create_all()
        backend = TableWindowStorage(own)
        assert await backend.check()
        assert await backend.incr("a/b#c?", 60) == 1  # characters table keys may not hold
        assert await backend.incr("a/b#c?", 60, amount=2) == 3
        assert await backend.incr("other", 60) == 1
        await backend.clear("a/b#c?")
        assert await backend.get("a/b#c?") == 0
        assert await backend.get("other") == 1
        assert await backend.reset() == 1
        assert await backend.get("other") == 0
