"""What a worker's writes cost the calling process: a 100-row Entity Group Transaction of
timeline entities (a backlog's deliveries to one reader) and a single upsert (a live
delivery), each to a partition of its own, 16 in flight as a worker keeps them, timed with
``time.process_time`` (Azurite is another process). Through the lean calls
(``timeline.storage.wire.lean``) and through the table SDK's own calls on the same clients."""

from __future__ import annotations

import secrets
import time
from typing import Any

from azure.data.tables import UpdateMode

from loadtest.bench.harness import bounded, timeline_entity
from loadtest.bench.single_calls import IN_FLIGHT, fresh_connection
from timeline.model.keys import now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.wire import lean

BATCHES = 48
BATCH_ROWS = 100
UPSERTS = 320


async def cpu_ms_per_write(storage: Storage, *, sdk: bool = False) -> dict[str, float]:
    """This process's CPU per batch and per upsert, lean or (``sdk``) the SDK's own calls;
    the entities are built before the clock starts."""
    prefix, ticks = secrets.token_hex(4), now_ticks()

    def batch_of(partition: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        return [
            ("upsert", timeline_entity(partition, ticks + row), {"mode": UpdateMode.REPLACE})
            for row in range(BATCH_ROWS)
        ]

    async def submit(operations: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> None:
        client = storage.table(TIMELINES, operations[0][1]["PartitionKey"])
        if sdk:
            await client.submit_transaction(operations)
        else:
            await lean.submit_transaction(client, operations)

    async def upsert(entity: dict[str, Any]) -> None:
        client = storage.table(TIMELINES, entity["PartitionKey"])
        if sdk:
            await client.upsert_entity(entity, mode=UpdateMode.REPLACE)
        else:
            await lean.upsert_entity(client, entity)

    await bounded((fresh_connection(storage, f"{prefix}-{i}") for i in range(IN_FLIGHT)), IN_FLIGHT)
    await bounded((submit(batch_of(f"{prefix}-warm-{i}")) for i in range(IN_FLIGHT)), IN_FLIGHT)
    batches = [batch_of(f"{prefix}-b{i}") for i in range(BATCHES)]
    started = time.process_time()
    await bounded((submit(batch) for batch in batches), IN_FLIGHT)
    batch_ms = 1000 * (time.process_time() - started) / BATCHES
    entities = [timeline_entity(f"{prefix}-u{i}", ticks) for i in range(UPSERTS)]
    started = time.process_time()
    await bounded((upsert(entity) for entity in entities), IN_FLIGHT)
    return {"batch": batch_ms, "upsert": 1000 * (time.process_time() - started) / UPSERTS}


async def write_calls(storage: Storage) -> dict[str, float]:
    """Both, twice each, interleaved (the machine's load drifts); the lower of each."""
    rounds: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(2):
        for sdk in (False, True):
            rounds[sdk].append(await cpu_ms_per_write(storage, sdk=sdk))
    result: dict[str, float] = {}
    for sdk, suffix in ((False, ""), (True, "_sdk")):
        for call in ("batch", "upsert"):
            result[f"{call}_call_cpu_ms{suffix}"] = min(r[call] for r in rounds[sdk])
    return result
