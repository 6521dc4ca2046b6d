"""Outages of any length: backoffs stay capped, and no counter grows into an error.

``backoff_delay`` once computed ``base * 2**attempt`` before capping it, which overflows a
float from attempt 1,024: a receiver failing that often raised and stopped the worker, and a
message deferred that many times (9-16 h at the default 60 s cap) failed to settle, each
lease then ended with no outcome, and it was poisoned as ``crashed``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import fanout_worker.worker as worker_module
import timeline.storage.queue as queue_module
from tests.conftest import eventually, make_settings, opened, running_worker, unique
from timeline.delivery.outcomes import Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.errors import StorageUnavailableError
from timeline.model.messages import FanoutMessage, Followed
from timeline.retry import backoff_delay
from timeline.storage.queue import FanoutQueue, Lane
from timeline.tools.azurite import Azurite


def test_backoff_at_attempt_ten_thousand_is_capped() -> None:
    for attempt in (1_024, 10_000, 10**9):
        assert 0 <= backoff_delay(attempt, base=0.2, cap=10) <= 10
        assert 0 <= backoff_delay(attempt, base=0.5, cap=60) <= 60


class _Unreachable(Lane):
    """A queue whose every receive fails, counted; the worker stops itself after ``LIMIT``."""

    LIMIT = 5_000
    calls = 0
    worker: Any = None

    async def receive(self, count: int, visibility_timeout_s: int) -> list[Any]:
        type(self).calls += 1
        if type(self).calls >= self.LIMIT:
            type(self).worker.stop()
        raise StorageUnavailableError("injected: the queue is unreachable", retry_after=1)


async def test_receiver_failing_five_thousand_times_does_not_raise(
    private_azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fake_sleep(self: Any, seconds: float) -> None:
        assert seconds <= 10
        await asyncio.sleep(0)

    monkeypatch.setattr(queue_module, "Lane", _Unreachable)
    monkeypatch.setattr(worker_module.Worker, "_sleep", fake_sleep)
    settings = make_settings(private_azurite.connection_string, tmp_path, worker_receivers=1)
    async with opened(settings):
        worker = worker_module.Worker(settings, settings.connection_string())
        _Unreachable.worker = worker
        await asyncio.wait_for(worker.async_run(), 120)  # raises if a receiver raised
    assert _Unreachable.calls >= _Unreachable.LIMIT


DEFERRED: list[FanoutMessage] = []


class _DeferOnce(FanoutProcessor):
    """Defers a message the first three times it sees it: storage trouble."""

    async def handle(self, message: FanoutMessage) -> Outcome:
        DEFERRED.append(message)
        if len(DEFERRED) <= 3:
            raise StorageUnavailableError("injected: storage unavailable", retry_after=1)
        return await super().handle(message)


async def test_message_deferred_for_hours_is_not_poisoned(
    private_azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that has already been deferred 5,000 times (days of outage) is deferred
    three times more, then done: never poisoned, and its backoff exponent stays bounded."""
    monkeypatch.setattr(worker_module, "FanoutProcessor", _DeferOnce)
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        worker_visibility_timeout_s=1,
        worker_max_crashes=2,
        worker_retry_cap_s=0.5,
    )
    follow = Followed(follower=unique("f"), subject=unique("s"), attempt=5_000)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(follow)
        async with running_worker(settings):

            async def drained() -> bool:
                return (await queue.depth()) == (0, 0) and len(DEFERRED) >= 4

            await eventually(drained, timeout_s=30, what="the message to be done")
        assert await queue.peek_poison() == []
