"""A rerun of a rebalance killed in its last flip fence waits the fence before it deletes.

A range flipped (``moved``, still ``frozen``) just before the kill must not be deleted from
its old home at once: a process whose last placement read came before the flip, and which
then cannot reach the placement home (the lease allows routing by that read for ``lease``
seconds), still reads that range from the old home. So a rerun first waits the fence (the
longest lease and storage timeout any process has recorded, plus the margin), then
unfreezes the flipped ranges, then goes on.

Process P reads the placement right before the flip and then cannot reach the placement
home. While the rerun works, P reads the moving partition again and again: every read P
routes must see all of it; a read P refuses (its lease ran out) is what the lease is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from tests.conftest import storage_on
from tests.faults import PlacementCutOff
from timeline.errors import StorageUnavailableError
from timeline.storage.accounts import Storage
from timeline.storage.names import SUBJECT_FOLLOWERS
from timeline.storage.placement import Placement, hash64, slot_of
from timeline.storage.rebalance import RebalanceError, Rebalancer
from timeline.tools.azurite import Azurite

LEASE_S, TIMEOUT_S, MARGIN_S = 3.0, 1.0, 0.5
"""Every process here runs with this lease and timeout, so each fence is 4.5 s."""
OPTIONS = {"timeout_s": TIMEOUT_S, "placement_lease_s": LEASE_S}


async def _followers(storage: Storage, subject: str) -> int:
    async with storage.guard():
        client = storage.reader(SUBJECT_FOLLOWERS, subject)
        return len(
            [
                e
                async for e in client.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": subject}
                )
            ]
        )


async def test_rerun_after_a_kill_in_the_last_flip_fence_waits_before_deleting(
    three_azurites: list[Azurite],
) -> None:
    two, three = three_azurites[:2], three_azurites
    async with storage_on(two, **OPTIONS) as storage:
        await storage.create_all()
    target = Placement.initial(tuple("abc"), 3)
    # A subject whose partition moves to the new account in the LAST of two ranges (odd slots).
    subject = next(
        f"celeb-{n}"
        for n in range(10_000)
        if target.home(hash64(f"celeb-{n}")) == 2 and slot_of(hash64(f"celeb-{n}")) % 2 == 1
    )
    async with (
        storage_on(two, **OPTIONS) as storage,
        storage.guard(),
    ):
        client = storage.table(SUBJECT_FOLLOWERS, subject)
        for n in range(5):
            await client.upsert_entity({"PartitionKey": subject, "RowKey": f"fan-{n}"})

    async with (
        storage_on(three, **OPTIONS) as process_p,
        PlacementCutOff(process_p, three[0]) as cut_off,
        storage_on(three, **OPTIONS) as admin,
    ):
        assert await _followers(process_p, subject) == 5
        fences = 0

        async def first_run_sleep(seconds: float) -> None:
            nonlocal fences
            fences += 1
            if fences == 4:  # the flip of the last range has just been written: killed
                raise RebalanceError("killed during the flip fence")
            await asyncio.sleep(seconds)  # every other fence really waits
            if fences == 3:  # the last range is frozen: P reads the placement (not moved yet)
                assert await process_p.refresh_placement() is not None
                cut_off.cut()

        with pytest.raises(RebalanceError):
            await Rebalancer(admin, margin_s=MARGIN_S, steps=2, sleep=first_run_sleep).run()

        slept: list[float] = []

        async def rerun_sleep(seconds: float) -> None:
            slept.append(seconds)
            await asyncio.sleep(seconds)

        seen: list[int] = []
        refused = 0

        async def read_through_p() -> None:
            """P's reads of the moved partition, for as long as the rerun works."""
            nonlocal refused
            while True:
                try:
                    seen.append(await _followers(process_p, subject))
                except StorageUnavailableError:
                    refused += 1
                await asyncio.sleep(0.05)

        reader = asyncio.create_task(read_through_p())
        rerun_started = time.monotonic()
        try:
            await Rebalancer(
                admin, margin_s=MARGIN_S, steps=2, progress=False, sleep=rerun_sleep
            ).run()
            rerun_took = time.monotonic() - rerun_started
            await asyncio.sleep(0.2)  # and once more after it (P's lease may still hold)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

        assert seen, "P never read"
        assert all(count == 5 for count in seen), (
            f"a process routing by its placement lease read {sorted(set(seen))} of 5 followers: "
            f"the rerun deleted the old home {rerun_took:.1f} s after starting and slept {slept} "
            f"(no fence after the flip it inherited); {refused} read(s) refused"
        )
        assert refused, "P's lease never ran out: its placement home was not made unreachable"
        assert slept, "the rerun never fenced"
        assert slept[0] >= LEASE_S + TIMEOUT_S, f"the rerun fenced only {slept}"
