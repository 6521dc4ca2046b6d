"""A single upsert on the lean path (a hand-built ``PUT`` through the lean pipeline) against
the SDK's ``upsert_entity`` on the same clients, on real Azurite: the same row written
whatever its values and keys, the same errors, the same retries on a busy server (503), and
a worker whose deliveries take it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from azure.data.tables import EdmType, EntityProperty, TableEntity, UpdateMode
from azure.data.tables.aio import TableClient

from fanout_worker.worker import Worker
from tests.conftest import make_settings, opened, unique
from tests.faults import StorageFront, front_on
from tests.storage.sdk import TABLE_PATHS
from tests.worker.helpers import author_with_followers, timeline_ids
from timeline.config import Settings
from timeline.model.messages import PostCreated
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.clients import Clients
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.storage.wire import lean
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

PATHS = list(TABLE_PATHS)
LONGEST_POST = "😀" * Settings.model_fields["max_post_chars"].metadata[-1].le
ODD_KEYS = ["o'brien", "''", "100%", "%27", "a b", "é😀", "&=+;,:@!$()*", '"q"']


def values() -> dict[str, Any]:
    return {
        "empty": "",
        "unicode": "héllo wörld 😀 𝄞 \u2028",
        "json": 'quote " backslash \\ newline \n percent %27',
        "longest": LONGEST_POST,
        "low": -(2**31),
        "high": 2**31 - 1,
        "int64": EntityProperty(2**40, EdmType.INT64),
        "int64_low": EntityProperty(-(2**63), EdmType.INT64),
        "yes": True,
        "half": 1.5,
        "when": datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC),
        "bytes": b"\x00\xff binary",
        "guid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "skipped": None,
    }


def shape(entity: TableEntity) -> dict[str, tuple[type, Any]]:
    return {name: (type(value), value) for name, value in entity.items()}


async def get(storage: Storage, partition: str, key: str) -> TableEntity:
    """The row as the SDK reads it."""
    client = storage.reader(TIMELINES, partition)
    return await client.get_entity(partition, key)


async def test_a_single_upsert_writes_what_the_sdk_writes(storage: Storage) -> None:
    """One row per path, same values; read back by the SDK, typed the same."""
    written: dict[str, TableEntity] = {}
    for path in PATHS:
        partition = unique(f"one-{path}")
        entity = {"PartitionKey": partition, "RowKey": "r", **values()}
        await TABLE_PATHS[path].submit_batch(storage, TIMELINES, partition, [("upsert", entity)])
        written[path] = await get(storage, partition, "r")
    lean_row, sdk_row = (shape(written[p]) for p in PATHS)
    del lean_row["PartitionKey"], sdk_row["PartitionKey"]
    assert lean_row == sdk_row
    assert written["lean"]["int64"].edm_type == EdmType.INT64
    assert written["lean"]["longest"] == LONGEST_POST
    assert "skipped" not in written["lean"]


@pytest.mark.parametrize("path", PATHS)
async def test_a_single_upsert_replaces_the_whole_row(storage: Storage, path: str) -> None:
    partition = unique("replace")
    submit_batch = TABLE_PATHS[path].submit_batch
    first = {"PartitionKey": partition, "RowKey": "r", "a": 1, "b": "two"}
    await submit_batch(storage, TIMELINES, partition, [("upsert", first)])
    second = {"PartitionKey": partition, "RowKey": "r", "c": ""}
    await submit_batch(storage, TIMELINES, partition, [("upsert", second)])
    assert dict(await get(storage, partition, "r")) == second


@pytest.mark.parametrize("path", PATHS)
async def test_odd_keys_take_a_single_upsert_alike(storage: Storage, path: str) -> None:
    """Quotes and percent signs in both keys: the row lands under exactly those keys."""
    partition = unique("odd'%") + "é"
    for key in ODD_KEYS:
        row = {"PartitionKey": partition, "RowKey": key, "k": key}
        await TABLE_PATHS[path].submit_batch(storage, TIMELINES, partition, [("upsert", row)])
    for key in ODD_KEYS:
        assert (await get(storage, partition, key))["k"] == key


def error_shape(error: HttpResponseError) -> tuple[Any, ...]:
    return type(error), error.status_code, str(error.error_code)  # type: ignore[attr-defined]


async def both_fail(client: TableClient, entity: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """The error each path raises for one upsert of ``entity`` through ``client``."""
    shapes = {}
    with pytest.raises(HttpResponseError) as by_lean:
        await lean.upsert_entity(client, entity)
    shapes["lean"] = error_shape(by_lean.value)
    with pytest.raises(HttpResponseError) as by_sdk:
        await client.upsert_entity(entity, mode=UpdateMode.REPLACE)
    shapes["sdk"] = error_shape(by_sdk.value)
    return shapes


async def test_a_missing_table_fails_alike(settings: Settings) -> None:
    text = settings.connection_string()
    async with TableClient.from_connection_string(text, f"missing{uuid.uuid4().hex[:8]}") as c:
        shapes = await both_fail(c, {"PartitionKey": "p", "RowKey": "r", "a": 1})
    assert shapes["lean"] == shapes["sdk"]
    assert shapes["lean"][:2] == (shapes["sdk"][0], 404)


@pytest.mark.parametrize(
    "entity",
    [
        {"PartitionKey": "p", "RowKey": "big", "text": "x" * 70_000},  # over 64 KiB
    ],
    ids=["too-large"],
)
async def test_a_refused_entity_fails_alike(storage: Storage, entity: dict[str, Any]) -> None:
    shapes = await both_fail(storage.table(TIMELINES, "p"), entity)
    assert shapes["lean"] == shapes["sdk"]
    assert 400 <= shapes["lean"][1] < 500


async def test_a_bare_int_beyond_int32_is_refused_alike(storage: Storage) -> None:
    """The SDK's own ``TypeError``, before anything is sent."""
    entity = {"PartitionKey": "p", "RowKey": "r", "n": 2**31}
    client = storage.table(TIMELINES, "p")
    with pytest.raises(TypeError) as by_lean:
        await lean.upsert_entity(client, entity)
    with pytest.raises(TypeError) as by_sdk:
        await client.upsert_entity(entity)
    assert str(by_lean.value) == str(by_sdk.value)


@pytest.fixture
async def busy_front(azurite: Azurite) -> AsyncIterator[StorageFront]:
    async with front_on(azurite) as front:
        yield front


@pytest.mark.parametrize("path", PATHS)
async def test_a_busy_server_is_retried_as_the_sdk_retries(
    busy_front: StorageFront, storage: Storage, path: str
) -> None:
    """Two 503s, then success: three PUTs, one row. Always busy: the client's retry budget
    (``StorageOptions.retries``, 2, plus the first: 3 PUTs), then the same 503 error."""
    clients = Clients([busy_front.connection_string()], StorageOptions())
    clients.open()  # the clients the worker builds (retries, backoff), on the front
    try:
        client = clients.tables[0][TIMELINES]
        partition = unique("busy")
        entity = {"PartitionKey": partition, "RowKey": "r", "text": "after two 503s"}

        async def upsert() -> None:
            if path == "lean":
                await lean.upsert_entity(client, entity)
            else:
                await client.upsert_entity(entity, mode=UpdateMode.REPLACE)

        busy_front.busy, busy_front.hits = 2, 0
        await upsert()
        assert busy_front.hits == 3
        assert (await get(storage, partition, "r"))["text"] == "after two 503s"

        busy_front.busy, busy_front.hits = 100, 0
        with pytest.raises(HttpResponseError) as caught:
            await upsert()
        assert busy_front.hits == 3
    finally:
        await clients.close()
    assert error_shape(caught.value) == (HttpResponseError, 503, "TableErrorCode.SERVER_BUSY")


async def test_the_worker_delivers_each_copy_as_a_lean_upsert(
    private_azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every follower's partition gets its copy as a batch of one, on the lean path: the
    SDK's ``upsert_entity`` carries none of them."""
    calls: list[str] = []
    original = TableClient.upsert_entity

    def spy(self: TableClient, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.table_name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TableClient, "upsert_entity", spy)
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        repos, queue = Repositories.on(storage), FanoutQueue(storage)
        author, post = await author_with_followers(storage, repos, 30)
        calls.clear()
        await queue.send(PostCreated(author=author, post_id=post.post_id))
        await asyncio.wait_for(
            Worker(settings, settings.connection_string()).async_run(burst=True), 60
        )
        for i in range(30):
            assert await timeline_ids(repos, f"f{i:05d}") == [post.post_id]
        assert await timeline_ids(repos, author) == [post.post_id]
    assert TIMELINES not in calls
