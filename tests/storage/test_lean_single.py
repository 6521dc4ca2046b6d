"""Single-entity calls on the lean path (``timeline.storage.lean_single``: point read,
insert, replace or merge with ``If-Match``, delete) against the SDK's own calls, on real
Azurite: the same entities, etags and metadata, the same errors (404, 409, 412, a bad etag),
odd keys, and the same retries on a busy server (503)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
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
from tests.storage.helpers import busy_front_on
from timeline.config import Settings
from timeline.storage import calls
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.azurite import Azurite
from timeline.storage.clients import Clients
from timeline.storage.names import TIMELINES

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


PATHS = ["lean", "sdk"]


@pytest.fixture(scope="module")
async def paths(settings: Settings, storage: Storage) -> AsyncIterator[dict[str, TableClient]]:
    """A ``timelines`` client per path: ``calls`` routes the first to the lean calls and the
    second (``TIMELINE_STORAGE_LEAN=false``) to the SDK's."""
    text = settings.connection_string()
    async with (
        Storage(text, StorageOptions(lean=True)) as on,
        Storage(text, StorageOptions(lean=False)) as off,
    ):
        yield {"lean": on.table(TIMELINES, "any"), "sdk": off.table(TIMELINES, "any")}


async def failure(call: Callable[[], Awaitable[Any]]) -> tuple[Any, ...]:
    """What ``call`` raised: its type, status, error code and first line (no request id)."""
    with pytest.raises(Exception) as caught:  # noqa: PT011 - comparing whatever each raises
        await call()
    error = caught.value
    code = getattr(error, "error_code", None)
    return type(error), getattr(error, "status_code", None), str(code), str(error).split("\n")[0]


async def alike(
    paths: dict[str, TableClient], call: Callable[[TableClient], Awaitable[Any]]
) -> tuple[Any, ...]:
    """The failure ``call`` gives on each path: the same on both."""
    by_lean = await failure(lambda: call(paths["lean"]))
    assert by_lean == await failure(lambda: call(paths["sdk"]))
    return by_lean


async def test_the_switch_routes_single_entity_calls(
    paths: dict[str, TableClient], settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lean clients never reach the SDK's single-entity calls; the switched-off ones and a
    client that is not ``Storage``'s own (a test's proxy) do."""
    seen: list[str] = []
    for name in ("get_entity", "create_entity", "update_entity", "delete_entity"):
        original = getattr(TableClient, name)

        def spy(self: TableClient, *a: Any, _name: str = name, _o: Any = original, **k: Any) -> Any:
            seen.append(_name)
            return _o(self, *a, **k)

        monkeypatch.setattr(TableClient, name, spy)
    partition = unique("switch")

    async def every_call(client: TableClient, key: str) -> None:
        await calls.create_entity(client, {"PartitionKey": partition, "RowKey": key})
        read = await calls.get_entity(client, partition, key)
        await calls.update_entity(client, read, UpdateMode.MERGE, match_condition=IF_UNCHANGED)
        await calls.delete_entity(client, partition, key)

    await every_call(paths["lean"], "lean")
    assert seen == []
    await every_call(paths["sdk"], "sdk")
    assert seen == ["create_entity", "get_entity", "update_entity", "delete_entity"]
    seen.clear()
    async with TableClient.from_connection_string(settings.connection_string(), TIMELINES) as plain:
        await every_call(plain, "plain")
    assert seen == ["create_entity", "get_entity", "update_entity", "delete_entity"]


async def test_a_point_read_gives_the_sdks_entity(paths: dict[str, TableClient]) -> None:
    partition = unique("read")
    await calls.create_entity(paths["sdk"], {"PartitionKey": partition, "RowKey": "r", **values()})
    by_lean, by_sdk = [await calls.get_entity(paths[p], partition, "r") for p in PATHS]
    assert shape(by_lean) == shape(by_sdk)
    assert by_lean["longest"] == LONGEST_POST
    assert by_lean["int64"].edm_type == EdmType.INT64
    assert str(by_lean.metadata["etag"]).startswith("W/")


async def test_a_point_read_selects_as_the_sdk_selects(paths: dict[str, TableClient]) -> None:
    partition = unique("select")
    await calls.create_entity(paths["sdk"], {"PartitionKey": partition, "RowKey": "r", **values()})
    for select in (["when", "int64"], ["RowKey"], ["absent"], ["unicode", "bytes", "guid"]):
        by_lean, by_sdk = [
            await calls.get_entity(paths[p], partition, "r", select=select) for p in PATHS
        ]
        assert shape(by_lean) == shape(by_sdk)
    only = await calls.get_entity(paths["lean"], partition, "r", select=["when"])
    assert set(only) == {"when"}


async def test_a_missing_row_fails_a_read_alike(paths: dict[str, TableClient]) -> None:
    partition = unique("missing")
    error = await alike(paths, lambda c: calls.get_entity(c, partition, "r"))
    assert error[:2] == (ResourceNotFoundError, 404)


async def test_an_insert_writes_and_answers_as_the_sdk(paths: dict[str, TableClient]) -> None:
    partition = unique("create")
    answers, rows = {}, {}
    for path in PATHS:
        entity = {"PartitionKey": partition, "RowKey": path, **values()}
        answers[path] = await calls.create_entity(paths[path], entity)
        rows[path] = await paths["sdk"].get_entity(partition, path)
        assert answers[path]["etag"] == rows[path].metadata["etag"]
        assert isinstance(answers[path]["date"], datetime)
    assert set(answers["lean"]) == set(answers["sdk"])
    assert answers["lean"]["version"] == answers["sdk"]["version"]
    by_lean, by_sdk = (shape(rows[path])[0] for path in PATHS)
    del by_lean["RowKey"], by_sdk["RowKey"]
    assert by_lean == by_sdk


async def test_an_existing_row_refuses_an_insert_alike(paths: dict[str, TableClient]) -> None:
    partition = unique("exists")
    entity = {"PartitionKey": partition, "RowKey": "r", "n": 1}
    await calls.create_entity(paths["sdk"], entity)
    error = await alike(paths, lambda c: calls.create_entity(c, {**entity, "n": 2}))
    assert error[:2] == (ResourceExistsError, 409)
    assert (await paths["sdk"].get_entity(partition, "r"))["n"] == 1


@pytest.mark.parametrize(
    "entity",
    [{"PartitionKey": "p"}, {"RowKey": "r"}, {"PartitionKey": "p", "RowKey": "r", "n": 2**31}],
    ids=["no-row-key", "no-partition-key", "bare-int64"],
)
async def test_a_refused_insert_fails_alike(
    paths: dict[str, TableClient], entity: dict[str, Any]
) -> None:
    error = await alike(paths, lambda c: calls.create_entity(c, entity))
    assert error[0] in (ValueError, TypeError)


@pytest.mark.parametrize("mode", [UpdateMode.REPLACE, UpdateMode.MERGE])
async def test_a_conditional_update_writes_and_answers_as_the_sdk(
    paths: dict[str, TableClient], mode: UpdateMode
) -> None:
    """Each path updates its own row if unchanged since read: the same row after, and the
    etag it returns is the row's new one."""
    partition = unique("update")
    rows = {}
    for path in PATHS:
        await calls.create_entity(
            paths["sdk"], {"PartitionKey": partition, "RowKey": path, "y": ""}
        )
        read = await calls.get_entity(paths[path], partition, path)
        change = {"PartitionKey": partition, "RowKey": path, **values()}
        etag = read.metadata["etag"]
        answer = await calls.update_entity(
            paths[path], change, mode, etag=etag, match_condition=IF_UNCHANGED
        )
        rows[path] = await paths["sdk"].get_entity(partition, path)
        assert answer["etag"] == rows[path].metadata["etag"] != etag
        assert set(answer) == {"date", "etag", "version"}
    by_lean, by_sdk = (shape(rows[path])[0] for path in PATHS)
    del by_lean["RowKey"], by_sdk["RowKey"]
    assert by_lean == by_sdk
    assert ("y" in by_lean) is (mode == UpdateMode.MERGE)


async def test_an_update_takes_the_etag_of_the_entity_it_was_read_as(
    paths: dict[str, TableClient],
) -> None:
    """``match_condition`` without ``etag``: the read entity's own etag, as in the SDK."""
    partition = unique("own-etag")
    for path in PATHS:
        await calls.create_entity(paths[path], {"PartitionKey": partition, "RowKey": path})
        read = await calls.get_entity(paths[path], partition, path)
        await calls.update_entity(paths[path], read, match_condition=IF_UNCHANGED)
        with pytest.raises(ResourceModifiedError):
            await calls.update_entity(paths[path], read, match_condition=IF_UNCHANGED)


@pytest.mark.parametrize("mode", [UpdateMode.REPLACE, UpdateMode.MERGE])
async def test_failed_updates_fail_alike(paths: dict[str, TableClient], mode: UpdateMode) -> None:
    """A changed row (412), a missing one (404, with or without an etag), a malformed etag."""
    partition = unique("update-fails")
    row = {"PartitionKey": partition, "RowKey": "r", "n": 1}
    await calls.create_entity(paths["sdk"], row)
    stale = await alike(
        paths,
        lambda c: calls.update_entity(c, row, mode, etag=STALE, match_condition=IF_UNCHANGED),
    )
    assert stale[:2] == (ResourceModifiedError, 412)
    gone = {**row, "RowKey": "gone"}
    missing = await alike(paths, lambda c: calls.update_entity(c, gone, mode))
    assert missing[:2] == (ResourceNotFoundError, 404)
    await alike(
        paths,
        lambda c: calls.update_entity(c, gone, mode, etag=STALE, match_condition=IF_UNCHANGED),
    )
    bad = await alike(
        paths,
        lambda c: calls.update_entity(c, row, mode, etag="bad", match_condition=IF_UNCHANGED),
    )
    assert bad[1] == 400
    assert (await paths["sdk"].get_entity(partition, "r"))["n"] == 1


async def test_deletes_delete_and_fail_alike(paths: dict[str, TableClient]) -> None:
    """Unconditional and conditional deletes; a changed row (412) and a malformed etag fail
    alike; a missing row is no error on either path."""
    partition = unique("delete")
    for path in PATHS:
        for key in ("any", "if"):
            await calls.create_entity(
                paths["sdk"], {"PartitionKey": partition, "RowKey": path + key}
            )

    def conditional(etag: str) -> Callable[[TableClient], Awaitable[Any]]:
        return lambda c: calls.delete_entity(
            c, partition, "leanif", etag=etag, match_condition=IF_UNCHANGED
        )

    assert (await alike(paths, conditional(STALE)))[:2] == (ResourceModifiedError, 412)
    assert (await alike(paths, conditional("bad")))[1] == 400
    for path in PATHS:
        await calls.delete_entity(paths[path], partition, path + "any")
        etag = (await paths["sdk"].get_entity(partition, path + "if")).metadata["etag"]
        await calls.delete_entity(
            paths[path], partition, path + "if", etag=etag, match_condition=IF_UNCHANGED
        )
        await calls.delete_entity(paths[path], partition, path + "any")  # missing: no error
        await calls.delete_entity(
            paths[path], partition, path + "if", etag=etag, match_condition=IF_UNCHANGED
        )
    assert [
        e
        async for e in paths["sdk"].query_entities(
            "PartitionKey eq @p", parameters={"p": partition}
        )
    ] == []


@pytest.mark.parametrize("path", PATHS)
async def test_odd_keys_take_every_call_alike(paths: dict[str, TableClient], path: str) -> None:
    """Quotes, percent signs, unicode and URL characters in both keys: every call finds the
    row under exactly those keys."""
    client = paths[path]
    partition = unique("odd'%") + "é😀"
    for key in ODD_KEYS:
        await calls.create_entity(client, {"PartitionKey": partition, "RowKey": key, "k": key})
    for key in ODD_KEYS:
        read = await calls.get_entity(client, partition, key)
        assert (read["PartitionKey"], read["RowKey"], read["k"]) == (partition, key, key)
        change = {"PartitionKey": partition, "RowKey": key, "k": key + "!"}
        await calls.update_entity(
            client,
            change,
            UpdateMode.REPLACE,
            etag=read.metadata["etag"],
            match_condition=IF_UNCHANGED,
        )
        assert (await paths["sdk"].get_entity(partition, key))["k"] == key + "!"
        await calls.delete_entity(client, partition, key)
        with pytest.raises(ResourceNotFoundError):
            await paths["sdk"].get_entity(partition, key)


@pytest.mark.parametrize("path", PATHS)
async def test_a_busy_server_is_retried_as_the_sdk_retries(azurite: Azurite, path: str) -> None:
    """Each call, two 503s then success: three requests. Always busy: the client's retry
    budget (``StorageOptions.retries``, 2, plus the first: 3 requests), then the 503. Each
    call has one request id, kept over its retries."""
    async with busy_front_on(azurite, ("GET", "POST", "PATCH", "PUT", "DELETE")) as front:
        clients = Clients([front.connection_string()], StorageOptions(lean=path == "lean"))
        clients.open()  # the clients the API builds (retries, backoff), on the front
        try:
            client = clients.tables[0][TIMELINES]
            partition = unique("busy")
            row = {"PartitionKey": partition, "RowKey": "r", "n": 1}
            steps: list[Callable[[], Awaitable[Any]]] = [
                lambda: calls.create_entity(client, row),
                lambda: calls.get_entity(client, partition, "r"),
                lambda: calls.update_entity(client, {**row, "n": 2}, UpdateMode.REPLACE),
                lambda: calls.update_entity(client, {**row, "m": 3}),
                lambda: calls.delete_entity(client, partition, "r"),
            ]
            for step in steps:
                front.busy, front.hits = 2, 0
                await step()
                assert front.hits == 3
            front.busy, front.hits = 100, 0
            with pytest.raises(HttpResponseError) as caught:
                await calls.get_entity(client, partition, "r")
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
