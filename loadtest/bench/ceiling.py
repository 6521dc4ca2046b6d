"""The raw storage ceilings every ratio divides by: single upserts and 100-op EGTs."""

from __future__ import annotations

import time
from typing import Any

from azure.data.tables import UpdateMode
from tqdm import tqdm

from loadtest.bench.harness import bounded, fresh_storage, timeline_entity
from loadtest.bench.sizes import Sizes
from timeline.model.keys import now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES


async def single_upsert_rate(storage: Storage, count: int, label: str) -> float:
    """Raw ``upsert_entity`` throughput, 64 in flight, timeline-shaped entities."""
    client = storage.table(TIMELINES, "")
    base = now_ticks()
    entities = [timeline_entity(f"{label}{i:06d}", base + i) for i in range(count)]

    async def upsert(entity: dict[str, Any]) -> None:
        await client.upsert_entity(entity, mode=UpdateMode.REPLACE)

    with tqdm(total=len(entities), desc=f"{label}: single upserts", leave=False) as bar:
        started = time.monotonic()
        await bounded((upsert(e) for e in entities), 64, bar)
        return len(entities) / (time.monotonic() - started)


async def adjacent_ceiling(storage: Storage, sizes: Sizes, label: str) -> float:
    """The single-write ceiling on the phase's own Azurite, moments from the phase itself:
    this shared machine drifts by a third within minutes, so ratios use the mean of one such
    probe just before and one just after the phase."""
    return await single_upsert_rate(storage, sizes.ceiling_entities // 2, label)


async def ceiling_single(sizes: Sizes) -> float:
    async with fresh_storage() as (_, storage):
        return await single_upsert_rate(storage, sizes.ceiling_entities, "ceiling")


async def ceiling_egt(sizes: Sizes) -> float:
    async with fresh_storage() as (_, storage):
        client = storage.table(TIMELINES, "")
        base = now_ticks()
        partitions = sizes.ceiling_entities // 100
        batches = [
            [("upsert", timeline_entity(f"u{p:06d}", base + i)) for i in range(100)]
            for p in range(partitions)
        ]

        async def submit(batch: list[Any]) -> None:
            await client.submit_transaction(batch)

        with tqdm(total=len(batches), desc="ceiling: 100-op EGTs", leave=False) as bar:
            started = time.monotonic()
            await bounded((submit(b) for b in batches), 16, bar)
            return partitions * 100 / (time.monotonic() - started)


async def ceilings(sizes: Sizes) -> dict[str, float]:
    return {
        "ceiling_single_eps": await ceiling_single(sizes),
        "ceiling_egt_eps": await ceiling_egt(sizes),
    }
