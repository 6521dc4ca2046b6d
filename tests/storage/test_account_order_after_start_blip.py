"""A process routes nothing until it has read the stored placement, even after a blip at start.

When the first configured account does not answer during ``Storage.open`` (a blip, slow DNS,
throttling) and the accounts are listed in another order than the placement's ([B, A]
instead of [A, B]), a process that routed by ``Placement.initial(configured list)`` would
send every partition to the other account. So "no placement row read yet" is not routable,
and the membership check runs once the placement has been read.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.names import USERS
from timeline.tools.azurite import Azurite


async def test_a_misordered_list_is_refused_even_after_a_blip_at_start(
    two_azurites: list[Azurite],
) -> None:
    a, b = two_azurites
    async with Storage([a.connection_string, b.connection_string]) as right:
        await right.create_all()

    options = StorageOptions(timeout_s=1.0, retries=0, placement_lease_s=3.0)
    b.signal(signal.SIGSTOP)  # the first *configured* account does not answer at start
    loop = asyncio.get_running_loop()
    loop.call_later(2.5, b.signal, signal.SIGCONT)
    try:
        wrong = Storage([b.connection_string, a.connection_string], options)
        await wrong.open()
    except ConfigurationError:
        return  # refused at start: what the fix should do (or keep refusing until checked)
    try:
        deadline = time.monotonic() + 20
        routed = False
        while time.monotonic() < deadline:
            try:
                async with wrong.guard():
                    client = wrong.table(USERS, "alice")
                    routed = True
                    await client.upsert_entity({"PartitionKey": "alice", "RowKey": "profile"})
                break
            except StorageUnavailableError as error:
                if "order" in error.message or "placement home" in error.message:
                    return  # refused later: also fine
                if routed:
                    break  # routed, and the write itself failed: still routed by that order
                await asyncio.sleep(0.2)
        assert routed, "never routed, never refused"
    finally:
        await wrong.close()
    async with Storage([a.connection_string, b.connection_string]) as right, right.guard():
        found = [
            e async for e in right.reader(USERS, "alice").query_entities("PartitionKey eq 'alice'")
        ]
    pytest.fail(
        "a process configured [B, A] started after a blip and routed a write by that order: "
        f"the partition's real home holds {len(found)} of its rows"
    )
