"""Leases whose outcome could not be written because the *queue* was briefly
unavailable (503 ServerBusy / timeout on update_message or delete_message) are counted as
worker crashes; at worker_max_crashes the message is poisoned as 'crashed' though no process
died: 'nothing poisoned by transient storage trouble' does not hold for queue trouble.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import timeline.storage.queue as queue_module
from tests.conftest import eventually, make_settings, opened, running_worker, unique
from timeline.errors import StorageUnavailableError
from timeline.model.messages import Followed
from timeline.storage.queue import FanoutQueue, Lane
from timeline.tools.azurite import Azurite

FAILS = [3]


class ThrottledSettles(Lane):
    async def delete(self, message: Any) -> None:
        if FAILS[0] > 0:
            FAILS[0] -= 1
            raise StorageUnavailableError(
                "injected 503 ServerBusy on delete_message", retry_after=1
            )
        await super().delete(message)


async def test_queue_trouble_poisons_as_crashed(
    private_azurite: Azurite,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(queue_module, "Lane", ThrottledSettles)
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        worker_visibility_timeout_s=1,
        worker_max_crashes=3,
    )
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(Followed(follower=unique("f"), subject=unique("s")))
        async with running_worker(settings):

            async def drained() -> bool:
                return (await queue.depth())[0] == 0

            await eventually(drained, timeout_s=30, what="the work queue to drain")
        poisoned = await queue.peek_poison()
    print("\npoisoned:", [p.reason for p in poisoned])
    assert poisoned == []
