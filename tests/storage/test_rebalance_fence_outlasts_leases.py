"""The rebalance fence outlasts the *services'* lease, whatever the admin shell's settings.

An operator may run ``timeline rebalance`` from a shell without the services' tuned
``TIMELINE_PLACEMENT_LEASE_S`` and ``TIMELINE_STORAGE_TIMEOUT_S``. A fence computed from the
shell's own values would be shorter than the services' lease: a service still routing by the
pre-freeze placement would write to the old home after the copy, and the acknowledged write
would be lost from the new home. So every process records its lease and storage timeout in
storage before it routes anything, and each fence waits the longest recorded lease plus the
longest recorded timeout plus the margin.

Here the service's lease is 8 s; the admin's own settings (1 s lease, 1 s timeout, 0.5 s
margin) would give a 2.5 s fence.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.conftest import make_settings, storage_on
from tests.faults import PlacementCutOff
from timeline.errors import StorageUnavailableError
from timeline.storage.accounts import Storage
from timeline.storage.names import USERS
from timeline.storage.placement import Placement, hash64
from timeline.storage.rebalance import Rebalancer
from timeline.tools.azurite import Azurite

TIMEOUT_S, ADMIN_LEASE_S, SERVICE_LEASE_S, MARGIN_S = 1.0, 1.0, 8.0, 0.5


async def test_a_rebalance_cannot_fence_shorter_than_the_services_lease(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    two, three = three_azurites[:2], three_azurites
    async with storage_on(two, timeout_s=TIMEOUT_S, placement_lease_s=ADMIN_LEASE_S) as storage:
        await storage.create_all()
    target = Placement.initial(tuple("abc"), 3)
    user = next(f"m-{n}" for n in range(1000) if target.home(hash64(f"m-{n}")) == 2)

    # The operator's shell: none of the services' tuned values.
    admin_settings = make_settings(
        "\n".join(s.connection_string for s in three),
        tmp_path,
        placement_lease_s=ADMIN_LEASE_S,
        storage_timeout_s=TIMEOUT_S,
    )
    slept: list[float] = []

    async def fence(seconds: float) -> None:
        slept.append(seconds)
        await asyncio.sleep(seconds)

    async with (
        storage_on(three, timeout_s=TIMEOUT_S, placement_lease_s=SERVICE_LEASE_S) as service,
        PlacementCutOff(service, three[0]) as cut_off,
        Storage(admin_settings.connection_string(), admin_settings.storage_options()) as admin,
    ):
        assert await service.refresh_placement() is not None  # its last good read: on 2
        cut_off.cut()
        await Rebalancer(admin, margin_s=MARGIN_S, steps=1, progress=False, sleep=fence).run()
        # A write of a moved partition, by the service's last placement read if it may still
        # route by it (then it must land where the partition lives now), else refused.
        acknowledged = False
        with contextlib.suppress(StorageUnavailableError):
            async with service.guard():
                client = service.table(USERS, user)
                await client.upsert_entity({"PartitionKey": user, "RowKey": "profile", "x": 1})
                acknowledged = True
        new_home = await admin.refresh_placement()
        assert new_home is not None
        async with admin.guard():
            rows = [
                e
                async for e in admin.reader(USERS, user).query_entities(
                    "PartitionKey eq @p", parameters={"p": user}
                )
            ]
    assert not acknowledged or rows, (
        f"a write acknowledged after a rebalance that fenced {slept} s landed on the old "
        "home; the new home has nothing"
    )
    assert all(seconds >= SERVICE_LEASE_S + TIMEOUT_S for seconds in slept), (
        f"the rebalance fenced {slept} s: shorter than the service's {SERVICE_LEASE_S} s lease "
        "plus one storage call"
    )
