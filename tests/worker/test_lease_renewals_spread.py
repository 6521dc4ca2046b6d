"""Leases taken in one receive renew at spread-out moments, not all at once: a wave of
queue calls at half the visibility timeout stalls a storage that is already slow."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from fanout_worker.lease import Lease
from tests.conftest import make_settings, opened
from timeline.model.messages import Followed
from timeline.model.priority import Priority
from timeline.storage.queue import FanoutQueue, Lane
from timeline.tools.azurite import Azurite

LEASES = 16
VISIBILITY_S = 4


class RecordingLane(Lane):
    """A real lane that notes when each renewal goes out."""

    renewed_at: list[float]
    all_renewed: asyncio.Event

    async def extend(self, message: Any, visibility_timeout_s: int) -> Any:
        self.renewed_at.append(asyncio.get_running_loop().time())
        if len(self.renewed_at) >= LEASES:
            self.all_renewed.set()
        return await super().extend(message, visibility_timeout_s)


async def test_leases_taken_together_renew_at_different_moments(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        lane = RecordingLane(queue, Priority.LOW)
        lane.renewed_at, lane.all_renewed = [], asyncio.Event()
        for n in range(LEASES):
            await lane.send_raw(Followed(follower=f"f{n}", subject="s").model_dump_json())
        messages = await lane.receive(LEASES, VISIBILITY_S)
        assert len(messages) == LEASES
        async with contextlib.AsyncExitStack() as leases:
            for message in messages:
                await leases.enter_async_context(Lease(lane, message, VISIBILITY_S))
            await asyncio.wait_for(lane.all_renewed.wait(), VISIBILITY_S * 2)
        first = sorted(lane.renewed_at[:LEASES])
        assert first[-1] - first[0] >= 0.05 * VISIBILITY_S, first  # at once: a few ms apart
