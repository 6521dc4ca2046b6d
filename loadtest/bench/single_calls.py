"""What a single-entity call (a post's rate-limit read and write, its counter shard's read)
costs the calling process: an insert, a point read, a replace ``If-Match`` the read's etag
and a delete per row, 16 rows at a time as the API phase keeps them in flight, timed with
``time.process_time`` (Azurite is another process), through ``timeline.storage.calls`` (the
lean path) and through the table SDK's own calls on the same clients."""

from __future__ import annotations

import secrets
import time
from contextlib import suppress

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from loadtest.bench.harness import bounded
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.names import RATE_LIMITS

ROWS = 320
IN_FLIGHT = 16
CALLS_PER_ROW = 4


async def cpu_ms_per_call(storage: Storage, *, sdk: bool = False) -> float:
    """This process's CPU per call through ``calls``, or (``sdk``) the SDK's own calls."""
    prefix = secrets.token_hex(4)

    async def cycle(partition: str) -> None:
        client = storage.table(RATE_LIMITS, partition)
        row = {"PartitionKey": partition, "RowKey": "~window", "count": 1, "expires_at": 1.5e9}
        changed, condition = {**row, "count": 2}, MatchConditions.IfNotModified
        if sdk:
            await client.create_entity(row)
            read = await client.get_entity(partition, "~window")
            await client.update_entity(
                changed, UpdateMode.REPLACE, etag=read.metadata["etag"], match_condition=condition
            )
            await client.delete_entity(partition, "~window")
            return
        await calls.create_entity(client, row)
        read = await calls.get_entity(client, partition, "~window")
        await calls.update_entity(
            client,
            changed,
            UpdateMode.REPLACE,
            etag=read.metadata["etag"],
            match_condition=condition,
        )
        await calls.delete_entity(client, partition, "~window")

    await bounded((fresh_connection(storage, f"{prefix}-{i}") for i in range(IN_FLIGHT)), IN_FLIGHT)
    await bounded((cycle(f"{prefix}-warm-{i}") for i in range(IN_FLIGHT)), IN_FLIGHT)
    started = time.process_time()
    await bounded((cycle(f"{prefix}-{i}") for i in range(ROWS)), IN_FLIGHT)
    return 1000 * (time.process_time() - started) / (ROWS * CALLS_PER_ROW)


async def fresh_connection(storage: Storage, partition: str) -> None:
    """A point read of a missing row: a GET, retried on a connection the emulator closed
    while the pool sat idle (a ``POST`` is not retried on a lost connection)."""
    with suppress(ResourceNotFoundError):
        await calls.get_entity(storage.reader(RATE_LIMITS, partition), partition, "~none")


async def single_calls(storage: Storage) -> dict[str, float]:
    """Both, twice each, interleaved (the machine's load drifts); the lower of each."""
    lean, sdk = [], []
    for _ in range(2):
        lean.append(await cpu_ms_per_call(storage))
        sdk.append(await cpu_ms_per_call(storage, sdk=True))
    return {"single_call_cpu_ms": min(lean), "single_call_cpu_ms_sdk": min(sdk)}
