"""The worker's adaptive storage limiter, driven by a simulated store on a fake clock.

The store is a model (a queue with ``servers`` requests served at once, ``service_s`` each),
not storage: what is under test is the control law, deterministically. How it behaves on
real Azurite is measured by ``make bench`` (``backlog`` phase)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from contextlib import AbstractAsyncContextManager

from timeline.model.priority import Priority, running_as
from timeline.storage.flow.limiter import AdaptiveLimiter, LimiterSettings, Outcome


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _simulate(
    limiter: AdaptiveLimiter, clock: Clock, *, servers: int, service_s: float, requests: int
) -> list[float]:
    """Keep the limiter full against a FIFO store serving ``servers`` requests at once;
    returns each request's latency."""
    free_at = [clock.now] * servers  # when each server is next free
    pending: list[tuple[float, int, float, AbstractAsyncContextManager[Outcome]]] = []
    order = itertools.count()
    latencies: list[float] = []
    started = 0
    while started < requests or pending:
        while started < requests and limiter.in_flight < int(limiter.limit):
            slot: AbstractAsyncContextManager[Outcome] = limiter.slot("write-100")
            await slot.__aenter__()
            begins = max(clock.now, heapq.heappop(free_at))
            heapq.heappush(free_at, begins + service_s)
            heapq.heappush(pending, (begins + service_s, next(order), clock.now, slot))
            started += 1
        done, _, sent, slot = heapq.heappop(pending)
        clock.now = done
        latencies.append(done - sent)
        await slot.__aexit__(None, None, None)
    return latencies


async def test_a_store_that_serves_one_at_a_time_gets_a_few_requests_not_hundreds() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(LimiterSettings(initial=16, maximum=256), clock=clock)
    latencies = await _simulate(limiter, clock, servers=1, service_s=0.01, requests=5000)
    assert 3 <= limiter.limit <= 8
    tail = latencies[-1000:]
    assert max(tail) <= 8 * 0.01  # others wait behind a handful of requests, not 16


async def test_a_store_that_serves_in_parallel_gets_its_parallelism() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(LimiterSettings(initial=16, maximum=256), clock=clock)
    latencies = await _simulate(limiter, clock, servers=100, service_s=0.03, requests=20_000)
    assert 90 <= limiter.limit <= 115
    assert sum(latencies[-2000:]) / 2000 < 2 * 0.03


async def test_a_fixed_concurrency_queues_what_the_limiter_would_not() -> None:
    """The control: without adapting, 256 in flight on a one-at-a-time store wait 256 deep."""
    clock = Clock()
    fixed = AdaptiveLimiter(LimiterSettings(initial=256, minimum=256, maximum=256), clock=clock)
    latencies = await _simulate(fixed, clock, servers=1, service_s=0.01, requests=3000)
    assert max(latencies[-500:]) > 2.0


async def test_timeouts_halve_the_limit_once_per_round() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(LimiterSettings(initial=64, maximum=256), clock=clock)
    slots = [limiter.slot("read") for _ in range(64)]
    outcomes = [await slot.__aenter__() for slot in slots]
    clock.now += 5.0
    for slot, outcome in zip(slots, outcomes, strict=True):
        outcome.congested = True
        await slot.__aexit__(None, None, None)
    assert limiter.limit == 32  # sixty-four timeouts in one round are one signal


async def test_high_priority_waiters_go_first_and_retry_after_holds_only_background() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(LimiterSettings(initial=1, minimum=1, maximum=1), clock=clock)
    first = limiter.slot("read")
    outcome = await first.__aenter__()
    order: list[str] = []

    async def take(name: str, level: Priority) -> None:
        with running_as(level):
            async with limiter.slot("read"):
                order.append(name)

    low = asyncio.create_task(take("low", Priority.LOW))
    await asyncio.sleep(0)
    high = asyncio.create_task(take("high", Priority.HIGH))
    await asyncio.sleep(0)
    outcome.congested, outcome.retry_after = True, 60.0  # throttled: background waits a minute
    await first.__aexit__(None, None, None)
    await high
    assert order == ["high"]
    assert not low.done()
    clock.now += 61
    limiter._timer_fired()  # what the loop's timer would do a minute later
    await low
    assert order == ["high", "low"]


async def test_background_waiters_get_one_place_in_five_while_user_facing_ones_wait() -> None:
    clock = Clock()
    limiter = AdaptiveLimiter(LimiterSettings(initial=1, minimum=1, maximum=1), clock=clock)
    order: list[Priority] = []

    async def call(level: Priority) -> None:
        with running_as(level):
            async with limiter.slot("read"):
                order.append(level)
                await asyncio.sleep(0)

    first = limiter.slot("read")
    await first.__aenter__()
    tasks = [asyncio.create_task(call(Priority.LOW)) for _ in range(3)]
    tasks += [asyncio.create_task(call(Priority.HIGH)) for _ in range(12)]
    await asyncio.sleep(0)
    await first.__aexit__(None, None, None)
    await asyncio.gather(*tasks)
    assert order[:10].count(Priority.LOW) == 2  # HIGH first, but LOW is never shut out
    assert order[4] == order[9] == Priority.LOW


async def test_background_held_back_by_retry_after_resumes_with_nothing_else_running() -> None:
    """A throttled answer holds background calls back; one that arrives when nothing else
    runs (no release will ever wake it) must still go once the hold has passed."""
    limiter = AdaptiveLimiter(LimiterSettings(initial=4, maximum=4))
    throttled = limiter.slot("read")
    outcome = await throttled.__aenter__()
    outcome.congested, outcome.retry_after = True, 0.05
    await throttled.__aexit__(None, None, None)
    assert limiter.in_flight == 0

    async def background_call() -> None:
        with running_as(Priority.LOW):
            async with limiter.slot("read"):
                pass

    await asyncio.wait_for(background_call(), 5)
