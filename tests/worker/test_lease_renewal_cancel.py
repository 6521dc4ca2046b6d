"""``_Lease.__aexit__`` cancels a renewal whose update_message already executed on
the server. The server's pop receipt changed, the client never learnt it, so the outcome
(delete / rewrite) is sent with a stale pop receipt: a 404 that is not StorageUnavailableError
escapes _process ("message task failed"); the work is redone after the lease expires and the
lease is counted as a crash.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import fanout_worker.worker as worker_module
import timeline.storage.queue as queue_module
from fanout_worker.worker import Worker
from tests.conftest import make_settings, opened, unique
from timeline.delivery.outcomes import Outcome
from timeline.delivery.processor import FanoutProcessor
from timeline.model.messages import FanoutMessage, Followed
from timeline.storage.queue import FanoutQueue, Lane
from timeline.tools.azurite import Azurite

HANDLED: list[float] = []
SLOW_ONCE: list[int] = []


class SlowAnswerQueue(Lane):
    async def extend(self, message: Any, visibility_timeout_s: int) -> Any:
        async with self._storage.guard(limited=False):
            updated = await self._queue.update_message(
                message, visibility_timeout=visibility_timeout_s
            )
        if not SLOW_ONCE:
            SLOW_ONCE.append(1)
            await asyncio.sleep(0.8)  # this answer is slow to arrive (executed on the server)
        message.pop_receipt = updated.pop_receipt
        message.next_visible_on = updated.next_visible_on
        return message


class SlowProcessor(FanoutProcessor):
    async def handle(self, message: FanoutMessage) -> Outcome:
        HANDLED.append(asyncio.get_running_loop().time())
        await asyncio.sleep(1.3)  # work that ends while the renewal at 1.0 s is in flight
        return await super().handle(message)


async def test_outcome_after_cancelled_renewal(
    private_azurite: Azurite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(queue_module, "Lane", SlowAnswerQueue)
    monkeypatch.setattr(worker_module, "FanoutProcessor", SlowProcessor)
    settings = make_settings(
        private_azurite.connection_string, tmp_path, worker_visibility_timeout_s=2
    )
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        # an old follow that never happened: the worker just syncs the index and is Done
        await queue.send(Followed(follower=unique("f"), subject=unique("s")))
        caplog.set_level(logging.ERROR)
        # burst: returns once the message is deleted and every task (and its log) is done
        worker = Worker(settings, settings.connection_string())
        await asyncio.wait_for(worker.async_run(burst=True), 60)
        assert await queue.depth() == (0, 0)
    failures = [r for r in caplog.records if "message task failed" in r.getMessage()]
    assert len(HANDLED) == 1
    assert not failures
