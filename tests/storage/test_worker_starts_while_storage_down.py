"""A worker started while storage does not answer consumes every queue shard once it does.

A worker (re)started during a storage blip, with ``TIMELINE_QUEUE_SHARDS`` unset while the
stored placement has 4 shards, must not build its shard list from ``Placement.initial`` (one
shard per configured account): it would consume ``fanout-0`` only, for its whole life, and if
every worker restarted in the same outage (a deploy, a node reboot) shards 1..3 would never be
consumed. So the worker waits for a placement read from storage before it builds its shard
list, and ``Storage.queue_shards`` raises until one has been read.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from tests.conftest import eventually, make_settings, running_worker
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.queue import FanoutQueue
from timeline.tools.azurite import Azurite


@pytest.mark.parametrize("blip", [False, True], ids=["control", "blip"])
async def test_a_worker_started_in_a_blip_consumes_every_stored_shard(
    private_azurite: Azurite, tmp_path: Path, blip: bool
) -> None:
    async with Storage(private_azurite.connection_string, StorageOptions(queue_shards=4)) as admin:
        await admin.create_all()
        assert admin.queue_shards == 4
        shard3 = FanoutQueue(admin, 3)
        settings = make_settings(
            private_azurite.connection_string, tmp_path, storage_timeout_s=1.0, storage_retries=0
        )
        answering = asyncio.Event()
        if blip:
            private_azurite.signal(signal.SIGSTOP)

            def resume() -> None:
                private_azurite.signal(signal.SIGCONT)
                answering.set()

            asyncio.get_running_loop().call_later(2.5, resume)
        else:
            answering.set()
        async with running_worker(settings):  # started while storage does not answer
            await answering.wait()
            await shard3.send_raw("not a fan-out message")  # a worker poisons this at once

            async def consumed() -> bool:
                return (await shard3.depth())[1] == 1

            await eventually(consumed, timeout_s=30, what="fanout-3 to be consumed")
