"""Values through the lean path and the SDK's own calls (``tests/storage/sdk.py``): what one
path writes, both read back the same, typed the same (int64, booleans, doubles, datetimes,
binary, GUIDs), whatever the keys and texts (quotes, percent signs, astral characters, the
longest post, empty strings)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from azure.data.tables import EdmType, EntityProperty, TableEntity, UpdateMode, _serialize
from azure.data.tables._deserialize import _convert_to_entity as sdk_convert

from tests.conftest import unique
from tests.storage import sdk
from tests.storage.sdk import TABLE_PATHS
from timeline.config import Settings
from timeline.model.entities import Page
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, query_rows, submit_batch, to_entity
from timeline.storage.names import TIMELINES
from timeline.storage.wire import lean
from timeline.storage.wire.egt import build_batch, entity_json, parse_batch

PATHS = list(TABLE_PATHS)
_convert_to_entity: Callable[[dict[str, Any]], TableEntity] = sdk_convert
LONGEST_POST = "😀" * Settings.model_fields["max_post_chars"].metadata[-1].le
"""The longest text a post may have (the setting's upper bound), in astral characters."""
ODD_KEYS = ["o'brien", "''", "100%", "%27", "a b", "é😀", "&=+;,:@!$()*", "x'", "-", '"q"']


def typed_values() -> dict[str, Any]:
    return {
        "empty": "",
        "unicode": "héllo wörld 😀 𝄞 \u2028",
        "json": 'quote " backslash \\ newline \n tab \t',
        "longest": LONGEST_POST,
        "zero": 0,
        "low": -(2**31),
        "high": 2**31 - 1,
        "int64": EntityProperty(2**40, EdmType.INT64),
        "int64_low": EntityProperty(-(2**63), EdmType.INT64),
        "yes": True,
        "no": False,
        "half": 1.5,
        "whole": 2.0,
        "huge": 1e300,
        "infinite": float("inf"),
        "when": datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC),
        "round": datetime(2000, 1, 1, tzinfo=UTC),
        "bytes": b"\x00\xff\x10binary",
        "guid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "skipped": None,
    }


async def read(
    storage: Storage, partition: str, select: list[str] | None = None, path: str = "lean"
) -> list[TableEntity]:
    page: Page[TableEntity] = await TABLE_PATHS[path].query_page(
        storage.reader(TIMELINES, partition),
        "PartitionKey eq @pk",
        {"pk": partition},
        select=select,
        limit=1000,
        continuation=None,
    )
    assert page.continuation is None
    return page.items


def shape(entity: TableEntity) -> dict[str, tuple[type, Any]]:
    """Each value with its type (an ``EntityProperty`` with its EDM type)."""
    return {name: (type(value), value) for name, value in entity.items()}


@pytest.mark.parametrize("writer", PATHS)
async def test_typed_values_round_trip_alike(storage: Storage, writer: str) -> None:
    partition = unique("typed")
    values = typed_values()
    operations: list[Operation] = [
        ("upsert", {"PartitionKey": partition, "RowKey": key, **values}) for key in ["a", "b"]
    ]
    await TABLE_PATHS[writer].submit_batch(storage, TIMELINES, partition, operations)
    by_lean, by_sdk = await read(storage, partition), await read(storage, partition, path="sdk")
    assert [shape(e) for e in by_lean] == [shape(e) for e in by_sdk]
    assert [e.metadata for e in by_lean] == [e.metadata for e in by_sdk]
    got = by_lean[0]
    expected = {k: v for k, v in values.items() if v is not None}
    assert {k: got[k] for k in expected} == expected
    assert got["int64"].edm_type == EdmType.INT64
    assert type(got["yes"]) is bool
    assert type(got["whole"]) is float
    assert got["when"].tzinfo is not None
    assert "skipped" not in got


async def test_rows_made_entities_are_the_entities_a_page_gives(storage: Storage) -> None:
    """``query_rows`` then ``to_entity`` (a home page's head rows) types values and carries
    the etag as the SDK's page does; the strings and booleans a page reads are the same raw."""
    partition = unique("rows")
    values = typed_values()
    operations: list[Operation] = [
        ("upsert", {"PartitionKey": partition, "RowKey": key, **values}) for key in ["a", "b"]
    ]
    await submit_batch(storage, TIMELINES, partition, operations)
    select = ["PartitionKey", "RowKey", *(k for k, v in values.items() if v is not None)]
    pages = await read(storage, partition, select, path="sdk")
    rows = await query_rows(
        storage.reader(TIMELINES, partition),
        "PartitionKey eq @pk",
        {"pk": partition},
        select=select,
        limit=1000,
        continuation=None,
    )
    entities = [to_entity(row) for row in rows.items]
    assert len(entities) == 2
    assert [shape(e) for e in entities] == [shape(e) for e in pages]
    assert [e.metadata for e in entities] == [e.metadata for e in pages]
    plain = ["RowKey", "empty", "unicode", "json", "longest", "yes", "no", "low"]
    assert [{k: r[k] for k in plain} for r in rows.items] == [
        {k: e[k] for k in plain} for e in pages
    ]


async def by_key(storage: Storage, partition: str, key: str, path: str) -> list[dict[str, Any]]:
    """The row with this key, found by a filter (the key a parameter, escaped by the SDK)."""
    page = await TABLE_PATHS[path].query_page(
        storage.reader(TIMELINES, partition),
        "PartitionKey eq @pk and RowKey eq @rk",
        {"pk": partition, "rk": key},
        select=["k"],
        limit=5,
        continuation=None,
    )
    return [dict(row) for row in page.items]


@pytest.mark.parametrize("writer", PATHS)
async def test_odd_keys_round_trip_alike(storage: Storage, writer: str) -> None:
    partition = unique("odd'%") + "é😀"
    operations: list[Operation] = [
        ("upsert", {"PartitionKey": partition, "RowKey": key, "k": key}) for key in ODD_KEYS
    ]
    await TABLE_PATHS[writer].submit_batch(storage, TIMELINES, partition, operations)
    found: dict[str, list[list[dict[str, Any]]]] = {}
    for path in PATHS:
        rows = await read(storage, partition, path=path)
        assert sorted(r["RowKey"] for r in rows) == sorted(ODD_KEYS)
        assert all(r["RowKey"] == r["k"] for r in rows)
        found[path] = [await by_key(storage, partition, key, path) for key in ODD_KEYS]
    assert found["lean"] == found["sdk"]
    assert found["lean"] == [[{"k": key}] for key in ODD_KEYS]
    deletes: list[Operation] = [
        ("delete", {"PartitionKey": partition, "RowKey": k}) for k in ODD_KEYS
    ]
    await TABLE_PATHS[writer].submit_batch(storage, TIMELINES, partition, deletes)
    assert await read(storage, partition, path="sdk") == []


async def test_a_select_of_missing_properties_reads_alike(storage: Storage) -> None:
    partition = unique("select")
    await sdk.transact(
        storage,
        TIMELINES,
        partition,
        [("upsert", {"PartitionKey": partition, "RowKey": "r", "a": 1})],
    )
    by_lean = await read(storage, partition, ["b", "a"])
    by_sdk = await read(storage, partition, ["b", "a"], path="sdk")
    assert by_lean == by_sdk == [{"a": 1}]
    assert by_lean[0].metadata == by_sdk[0].metadata


@pytest.mark.parametrize("writer", PATHS)
async def test_replace_and_merge_upserts_alike(storage: Storage, writer: str) -> None:
    partition = unique("modes")
    transact = TABLE_PATHS[writer].transact
    start = {"PartitionKey": partition, "RowKey": "r", "a": 1, "b": 2}
    await transact(storage, TIMELINES, partition, [("upsert", start)])
    merge = {"PartitionKey": partition, "RowKey": "r", "b": 3, "c": 4}
    await transact(storage, TIMELINES, partition, [("upsert", merge)])  # MERGE by default
    assert dict((await read(storage, partition, path="sdk"))[0]) == {**start, "b": 3, "c": 4}
    replace = (
        "upsert",
        {"PartitionKey": partition, "RowKey": "r", "d": 5},
        {"mode": UpdateMode.REPLACE},
    )
    await transact(storage, TIMELINES, partition, [replace])
    assert dict((await read(storage, partition, path="sdk"))[0]) == {
        "PartitionKey": partition,
        "RowKey": "r",
        "d": 5,
    }


def test_an_int_beyond_int32_is_refused_alike() -> None:
    entity = {"PartitionKey": "p", "RowKey": "r", "n": 2**31}
    with pytest.raises(TypeError) as sdk:
        _serialize._add_entity_properties(entity)
    with pytest.raises(TypeError) as ours:
        entity_json(entity)
    assert str(ours.value) == str(sdk.value)


def test_bad_batches_are_refused_before_sending_alike() -> None:
    mixed = [
        ("upsert", {"PartitionKey": "p", "RowKey": "a"}),
        ("upsert", {"PartitionKey": "q", "RowKey": "b"}),
    ]
    with pytest.raises(ValueError, match="Partition Keys in the batch must all be the same"):
        build_batch("http://x", "t", mixed, "2019-02-02")
    with pytest.raises(ValueError, match="PartitionKey and/or RowKey were not provided"):
        build_batch("http://x", "t", [("upsert", {"PartitionKey": "p"})], "2019-02-02")
    with pytest.raises(ValueError, match="Unrecognized operation"):
        build_batch("http://x", "t", [("explode", {"PartitionKey": "p", "RowKey": "a"})], "v")


def test_entity_json_types_values_as_the_sdk_does() -> None:
    """The same JSON values and annotations as the SDK's, except the ``Edm.String`` ones a
    JSON string does not need."""
    entity = {"PartitionKey": "p", "RowKey": "r", **typed_values()}
    ours = orjson.loads(entity_json(entity))
    sdk = orjson.loads(orjson.dumps(_serialize._add_entity_properties(entity)))
    strings = {k for k, v in sdk.items() if k.endswith("@odata.type") and v == "Edm.String"}
    assert ours == {k: v for k, v in sdk.items() if k not in strings}


ROWS: list[dict[str, Any]] = [
    {
        "odata.etag": "W/\"datetime'2026-11-25T13%3A22%3A59.9289678Z'\"",
        "PartitionKey": "p",
        "RowKey": "a'%",
        "s": "héllo 😀",
        "i": 5,
        "bare64": 2**40,
        "big@odata.type": "Edm.Int64",
        "big": "1099511627776",
        "b": True,
        "f": 1.5,
        "whole@odata.type": "Edm.Double",
        "whole": 2,
        "nan@odata.type": "Edm.Double",
        "nan": "NaN",
        "d@odata.type": "Edm.DateTime",
        "d": "2024-01-02T03:04:05.1234567Z",
        "bin@odata.type": "Edm.Binary",
        "bin": "AAE=",
        "g@odata.type": "Edm.Guid",
        "g": "12345678-1234-5678-1234-567812345678",
        "odd@odata.type": "Edm.Boolean",
        "odd": True,
        "empty": "",
        "Timestamp": "2026-11-25T13:22:59.9289678Z",
    },
    {"Timestamp": "2026-11-25T13:22:59Z", "RowKey": "no etag"},
    {"odata.etag": 'W/"x"', "odata.type": "account.table"},
    {},
]


@pytest.mark.parametrize("row", ROWS)
def test_rows_decode_as_the_sdk_decodes_them(row: dict[str, Any]) -> None:
    ours, sdk = lean.to_entity(dict(row)), _convert_to_entity(dict(row))
    nan = [k for k, v in sdk.items() if isinstance(v, float) and math.isnan(v)]
    assert all(math.isnan(ours[k]) for k in nan)
    assert {k: (type(v), v) for k, v in ours.items() if k not in nan} == {
        k: (type(v), v) for k, v in sdk.items() if k not in nan
    }
    assert list(ours) == list(sdk)
    assert ours.metadata == sdk.metadata
    assert type(ours.metadata["timestamp"]) is type(sdk.metadata["timestamp"])


def test_a_batch_reply_is_parsed_into_its_operations() -> None:
    reply = (
        b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n"
        b"--changesetresponse_2\r\nContent-Type: application/http\r\n"
        b"Content-Transfer-Encoding: binary\r\n\r\nHTTP/1.1 204 No Content\r\n"
        b'ETag: W/"1"\r\n\r\n\r\n'
        b"--changesetresponse_2\r\nContent-Type: application/http\r\n"
        b"Content-Transfer-Encoding: binary\r\n\r\nHTTP/1.1 404 Not Found\r\n"
        b"Content-Type: application/json;odata=minimalmetadata;charset=utf-8\r\n\r\n"
        b'{"odata.error":{"code":"ResourceNotFound","message":{"value":"1:gone"}}}\r\n'
        b"--changesetresponse_2--\r\n--batchresponse_1--\r\n"
    )
    parts = parse_batch('multipart/mixed; boundary="batchresponse_1"', reply)
    assert [(p.status_code, p.reason) for p in parts] == [(204, "No Content"), (404, "Not Found")]
    assert parts[0].headers["etag"] == 'W/"1"'
    assert orjson.loads(parts[1].body)["odata.error"]["code"] == "ResourceNotFound"
