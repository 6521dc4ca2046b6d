"""Single-entity calls on the lean path (``timeline.storage.wire.lean_single``: point read,
insert, replace or merge with ``If-Match``, delete) against the SDK's own calls on the same
client (``tests/storage/sdk.py``), on real Azurite: the same entities, etags and metadata,
the same errors (404, 409, 412, a bad etag), odd keys, and the same retries on a busy server
(503)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import EdmType, EntityProperty, TableEntity, UpdateMode
from azure.data.tables.aio import TableClient

from tests.conftest import unique
from tests.faults import front_on
from tests.storage import sdk
from tests.storage.sdk import TABLE_PATHS
from timeline.config import Settings
from timeline.storage import calls
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.clients import Clients
from timeline.storage.names import TIMELINES
from timeline.tools.azurite import Azurite

LONGEST_POST = "😀" * Settings.model_fields["max_post_chars"].metadata[-1].le
ODD_KEYS = ["o'brien", "''", "100%", "%27", "a b", "é😀", "&=+;,:@!$()*", '"q"']
STALE = "W/\"datetime'2020-01-01T00%3A00%3A00.0000000Z'\""
IF_UNCHANGED = MatchConditions.IfNotModified


def values() -> dict[str, Any]:
    return {
        "empty": "",
        "unicode": "héllo wörld 😀 𝄞 \u2028",
        "json": 'quote " backslash \\ newline \n percent %27',
        "longest": LONGEST_POST,
        "low": -(2**31),
        "high": 2**31 - 1,
        "int64": EntityProperty(2**40, EdmType.INT64),
        "yes": True,
        "half": 1.5,
        "when": datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC),
        "bytes": b"\x00\xff binary",
        "guid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    }


def shape(entity: TableEntity) -> tuple[dict[str, tuple[type, Any]], dict[str, Any]]:
    """Every property's type and value, and the metadata (etag, timestamp)."""
    return {k: (type(v), v) for k, v in entity.items()}, dict(entity.metadata)


def written(meta: Any) -> dict[str, Any]:
    """A write's returned metadata, without what differs per request (the date's second)."""
    return {k: v for k, v in dict(meta).items() if k not in ("date", "content")}


PATHS = list(TABLE_PATHS)
Call = Callable[[Any], Awaitable[Any]]
"""A call made on one path's module (``calls`` or ``tests.storage.sdk``)."""


@pytest.fixture(scope="module")
def table(storage: Storage) -> TableClient:
    """A ``timelines`` client of the session's ``Storage``, for both paths."""
    return storage.table(TIMELINES, "any")


async def failure(call: Callable[[], Awaitable[Any]]) -> tuple[Any, ...]:
    """What ``call`` raised: its type, status, error code and first line (no request id)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - comparing whatever each raises
        await call()
    error = caught.value
    code = getattr(error, "error_code", None)
    return type(error), getattr(error, "status_code", None), str(code), str(error).split("\n")[0]


async def alike(call: Call) -> tuple[Any, ...]:
    """The failure ``call`` gives on each path: the same on both."""
    by_lean = await failure(lambda: call(calls))
    assert by_lean == await failure(lambda: call(sdk))
    return by_lean


async def test_a_point_read_gives_the_sdks_entity(table: TableClient) -> None:
    partition = unique("read")
    await sdk.create_entity(table, {"PartitionKey": partition, "RowKey": "r", **values()})
    by_lean, by_sdk = [await TABLE_PATHS[p].get_entity(table, partition, "r") for p in PATHS]
    assert shape(by_lean) == shape(by_sdk)
    assert by_lean["longest"] == LONGEST_POST
    assert by_lean["int64"].edm_type == EdmType.INT64
    assert str(by_lean.metadata["etag"]).startswith("W/")


async def test_a_point_read_selects_as_the_sdk_selects(table: TableClient) -> None:
    partition = unique("select")
    await sdk.create_entity(table, {"PartitionKey": partition, "RowKey": "r", **values()})
    for select in (["when", "int64"], ["RowKey"], ["absent"], ["unicode", "bytes", "guid"]):
        by_lean, by_sdk = [
            await TABLE_PATHS[p].get_entity(table, partition, "r", select=select) for p in PATHS
        ]
        assert shape(by_lean) == shape(by_sdk)
    only = await calls.get_entity(table, partition, "r", select=["when"])
    assert set(only) == {"when"}


async def test_a_missing_row_fails_a_read_alike(table: TableClient) -> None:
    partition = unique("missing")
    error = await alike(lambda path: path.get_entity(table, partition, "r"))
    assert error[:2] == (ResourceNotFoundError, 404)


async def test_an_insert_writes_and_answers_as_the_sdk(table: TableClient) -> None:
    partition = unique("create")
    answers, rows = {}, {}
    for path in PATHS:
        entity = {"PartitionKey": partition, "RowKey": path, **values()}
        answers[path] = await TABLE_PATHS[path].create_entity(table, entity)
        rows[path] = await table.get_entity(partition, path)
        assert answers[path]["etag"] == rows[path].metadata["etag"]
        assert isinstance(answers[path]["date"], datetime)
    assert set(answers["lean"]) == set(answers["sdk"])
    assert answers["lean"]["version"] == answers["sdk"]["version"]
    by_lean, by_sdk = (shape(rows[path])[0] for path in PATHS)
    del by_lean["RowKey"], by_sdk["RowKey"]
    assert by_lean == by_sdk


async def test_an_existing_row_refuses_an_insert_alike(table: TableClient) -> None:
    partition = unique("exists")
    entity = {"PartitionKey": partition, "RowKey": "r", "n": 1}
    await sdk.create_entity(table, entity)
    error = await alike(lambda path: path.create_entity(table, {**entity, "n": 2}))
    assert error[:2] == (ResourceExistsError, 409)
    assert (await table.get_entity(partition, "r"))["n"] == 1


@pytest.mark.parametrize(
    "entity",
    [{"PartitionKey": "p"}, {"RowKey": "r"}, {"PartitionKey": "p", "RowKey": "r", "n": 2**31}],
    ids=["no-row-key", "no-partition-key", "bare-int64"],
)
async def test_a_refused_insert_fails_alike(table: TableClient, entity: dict[str, Any]) -> None:
    error = await alike(lambda path: path.create_entity(table, entity))
    assert error[0] in (ValueError, TypeError)


@pytest.mark.parametrize("mode", [UpdateMode.REPLACE, UpdateMode.MERGE])
async def test_a_conditional_update_writes_and_answers_as_the_sdk(
    table: TableClient, mode: UpdateMode
) -> None:
    """Each path updates its own row if unchanged since read: the same row after, and the
    etag it returns is the row's new one."""
    partition = unique("update")
    rows = {}
    for path in PATHS:
        await sdk.create_entity(table, {"PartitionKey": partition, "RowKey": path, "y": ""})
        read = await TABLE_PATHS[path].get_entity(table, partition, path)
        change = {"PartitionKey": partition, "RowKey": path, **values()}
        etag = read.metadata["etag"]
        answer = await TABLE_PATHS[path].update_entity(
            table, change, mode, etag=etag, match_condition=IF_UNCHANGED
        )
        rows[path] = await table.get_entity(partition, path)
        assert answer["etag"] == rows[path].metadata["etag"] != etag
        assert set(answer) == {"date", "etag", "version"}
    by_lean, by_sdk = (shape(rows[path])[0] for path in PATHS)
    del by_lean["RowKey"], by_sdk["RowKey"]
    assert by_lean == by_sdk
    assert ("y" in by_lean) is (mode == UpdateMode.MERGE)


async def test_an_update_takes_the_etag_of_the_entity_it_was_read_as(
    table: TableClient,
) -> None:
    """``match_condition`` without ``etag``: the read entity's own etag, as in the SDK."""
    partition = unique("own-etag")
    for path in PATHS:
        on = TABLE_PATHS[path]
        await on.create_entity(table, {"PartitionKey": partition, "RowKey": path})
        read = await on.get_entity(table, partition, path)
        await on.update_entity(table, read, match_condition=IF_UNCHANGED)
        with pytest.raises(ResourceModifiedError):
            await on.update_entity(table, read, match_condition=IF_UNCHANGED)


@pytest.mark.parametrize("mode", [UpdateMode.REPLACE, UpdateMode.MERGE])
async def test_failed_updates_fail_alike(table: TableClient, mode: UpdateMode) -> None:
    """A changed row (412), a missing one (404, with or without an etag), a malformed etag."""
    partition = unique("update-fails")
    row = {"PartitionKey": partition, "RowKey": "r", "n": 1}
    await sdk.create_entity(table, row)

    def update(entity: dict[str, Any], etag: str | None = None) -> Call:
        condition = IF_UNCHANGED if etag else None
        return lambda path: path.update_entity(
            table, entity, mode, etag=etag, match_condition=condition
        )

    stale = await alike(update(row, STALE))
    assert stale[:2] == (ResourceModifiedError, 412)
    gone = {**row, "RowKey": "gone"}
    missing = await alike(update(gone))
    assert missing[:2] == (ResourceNotFoundError, 404)
    await alike(update(gone, STALE))
    bad = await alike(update(row, "bad"))
    assert bad[1] == 400
    assert (await table.get_entity(partition, "r"))["n"] == 1


async def test_deletes_delete_and_fail_alike(table: TableClient) -> None:
    """Unconditional and conditional deletes; a changed row (412) and a malformed etag fail
    alike; a missing row is no error on either path."""
    partition = unique("delete")
    for path in PATHS:
        for key in ("any", "if"):
            await sdk.create_entity(table, {"PartitionKey": partition, "RowKey": path + key})

    def conditional(etag: str) -> Call:
        return lambda path: path.delete_entity(
            table, partition, "leanif", etag=etag, match_condition=IF_UNCHANGED
        )

    assert (await alike(conditional(STALE)))[:2] == (ResourceModifiedError, 412)
    assert (await alike(conditional("bad")))[1] == 400
    for path in PATHS:
        on = TABLE_PATHS[path]
        await on.delete_entity(table, partition, path + "any")
        etag = (await table.get_entity(partition, path + "if")).metadata["etag"]
        await on.delete_entity(
            table, partition, path + "if", etag=etag, match_condition=IF_UNCHANGED
        )
        await on.delete_entity(table, partition, path + "any")  # missing: no error
        await on.delete_entity(
            table, partition, path + "if", etag=etag, match_condition=IF_UNCHANGED
        )
    rows = table.query_entities("PartitionKey eq @p", parameters={"p": partition})
    assert [e async for e in rows] == []


@pytest.mark.parametrize("path", PATHS)
async def test_odd_keys_take_every_call_alike(table: TableClient, path: str) -> None:
    """Quotes, percent signs, unicode and URL characters in both keys: every call finds the
    row under exactly those keys."""
    on = TABLE_PATHS[path]
    partition = unique("odd'%") + "é😀"
    for key in ODD_KEYS:
        await on.create_entity(table, {"PartitionKey": partition, "RowKey": key, "k": key})
    for key in ODD_KEYS:
        read = await on.get_entity(table, partition, key)
        assert (read["PartitionKey"], read["RowKey"], read["k"]) == (partition, key, key)
        change = {"PartitionKey": partition, "RowKey": key, "k": key + "!"}
        await on.update_entity(
            table,
            change,
            UpdateMode.REPLACE,
            etag=read.metadata["etag"],
            match_condition=IF_UNCHANGED,
        )
        assert (await table.get_entity(partition, key))["k"] == key + "!"
        await on.delete_entity(table, partition, key)
        with pytest.raises(ResourceNotFoundError):
            await table.get_entity(partition, key)


@pytest.mark.parametrize("path", PATHS)
async def test_a_busy_server_is_retried_as_the_sdk_retries(azurite: Azurite, path: str) -> None:
    """Each call, two 503s then success: three requests. Always busy: the client's retry
    budget (``StorageOptions.retries``, 2, plus the first: 3 requests), then the 503. Each
    call has one request id, kept over its retries."""
    async with front_on(azurite, ("GET", "POST", "PATCH", "PUT", "DELETE")) as front:
        clients = Clients([front.connection_string()], StorageOptions())
        clients.open()  # the clients the API builds (retries, backoff), on the front
        try:
            client = clients.tables[0][TIMELINES]
            on = TABLE_PATHS[path]
            partition = unique("busy")
            row = {"PartitionKey": partition, "RowKey": "r", "n": 1}
            steps: list[Callable[[], Awaitable[Any]]] = [
                lambda: on.create_entity(client, row),
                lambda: on.get_entity(client, partition, "r"),
                lambda: on.update_entity(client, {**row, "n": 2}, UpdateMode.REPLACE),
                lambda: on.update_entity(client, {**row, "m": 3}),
                lambda: on.delete_entity(client, partition, "r"),
            ]
            for step in steps:
                front.busy, front.hits = 2, 0
                await step()
                assert front.hits == 3
            front.busy, front.hits = 100, 0
            with pytest.raises(HttpResponseError) as caught:
                await on.get_entity(client, partition, "r")
            assert front.hits == 3
        finally:
            await clients.close()
    code = str(caught.value.error_code)  # type: ignore[attr-defined]
    assert (caught.value.status_code, code) == (503, "TableErrorCode.SERVER_BUSY")
    # every try carries a client request id; a call's retries share its id, as the SDK's do
    ids = front.request_ids
    assert all(ids)
    assert len(ids) == 3 * (len(steps) + 1)
    assert [len(set(ids[i : i + 3])) for i in range(0, len(ids), 3)] == [1] * (len(steps) + 1)
    assert len(set(ids)) == len(steps) + 1
