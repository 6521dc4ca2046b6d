"""``submit_batch`` must route every request it sends.

The fence argument needs every request to be sent within one storage call (``T``) of the
moment it was routed. ``submit_batch`` called ``storage.table()`` once, then looped: an EGT
of deletes that meets a missing row drops that delete and is resent, on the *same* client,
up to once per operation. With every call inside its timeout (0.9 s < T = 1 s here), the
fifth call of a batch routed before the freeze landed on the old home after the copy: the
delete was acknowledged, yet the row lived on at the new home (a copy of a deleted post that
stays for good when this was the delete's second pass).

The fix: ``submit_batch`` routes again, inside the storage guard, before every request. A
batch refused mid-way (its partition is frozen) is retried as a caller would after a 503;
every acknowledged delete must hold at the partition's new home.
"""

from __future__ import annotations

import asyncio
import time

from yarl import URL

from tests.conftest import storage_on
from tests.faults import WRITES, Delay, table_of
from timeline.errors import StorageUnavailableError
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, submit_batch
from timeline.storage.names import TIMELINES
from timeline.storage.placement import Placement, hash64
from timeline.storage.rebalance import Rebalancer
from timeline.tools.azurite import Azurite

LEASE_S, TIMEOUT_S, MARGIN_S = 1.5, 1.0, 0.1
"""Every process here runs with this lease and timeout, so each fence is 2.6 s."""
OPTIONS = {"timeout_s": TIMEOUT_S, "placement_lease_s": LEASE_S}


async def _until_acknowledged(storage: Storage, owner: str, batch: list[Operation]) -> int:
    """Send the batch, and again after every retryable refusal; the refusals it took."""
    refused = 0
    deadline = time.monotonic() + 60
    while True:
        try:
            await submit_batch(storage, TIMELINES, owner, batch)
            return refused
        except StorageUnavailableError:
            refused += 1
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_delete_batch_routed_before_a_freeze_never_lands_after_the_copy(
    three_azurites: list[Azurite],
) -> None:
    two, three = three_azurites[:2], three_azurites
    async with storage_on(two, **OPTIONS) as storage:
        await storage.create_all()
    target = Placement.initial(tuple("abc"), 3)
    owner = next(f"o-{n}" for n in range(1000) if target.home(hash64(f"o-{n}")) == 2)
    async with (
        storage_on(two, **OPTIONS) as storage,
        storage.guard(),
    ):
        client = storage.table(TIMELINES, owner)
        for row in ("r1", "r2"):
            await client.upsert_entity({"PartitionKey": owner, "RowKey": row})

    slow_ports: set[int] = set()

    def to_the_old_home(method: str, url: URL) -> bool:
        """A write of ``timelines`` (alone or in a transaction) to the old home."""
        return (
            method in WRITES
            and url.port in slow_ports
            and table_of(url.path) in (TIMELINES, "$batch")
        )

    # each such write of the process takes 0.9 s (inside the 1 s storage timeout)
    slow = Delay(0.9, to_the_old_home)
    async with (
        storage_on(three, **OPTIONS, trace_configs=(slow.config(),)) as process,
        storage_on(three, **OPTIONS) as admin,
    ):
        old_home = process.placement.home(hash64(owner))
        slow_ports.add(three[old_home].ports[2])
        await process.refresh_placement()  # a fresh read: the batch is routed well inside it
        missing: list[Operation] = [
            ("delete", {"PartitionKey": owner, "RowKey": f"m{n}"}) for n in range(4)
        ]
        batch = [*missing, ("delete", {"PartitionKey": owner, "RowKey": "r1"})]
        deleting = asyncio.create_task(_until_acknowledged(process, owner, batch))
        await slow.started.wait()  # the batch is on its way to the old home
        await Rebalancer(admin, margin_s=MARGIN_S, steps=1, progress=False).run()
        refused = await deleting  # acknowledged
        assert await admin.refresh_placement() is not None
        async with admin.guard():
            home = admin.reader(TIMELINES, owner)
            rows = sorted(
                [
                    e["RowKey"]
                    async for e in home.query_entities(
                        "PartitionKey eq @p", parameters={"p": owner}
                    )
                ]
            )
    assert rows == ["r2"], (
        f"an acknowledged delete of r1 did not hold: the new home has {rows} "
        f"(the batch was refused {refused} time(s) first)"
    )
