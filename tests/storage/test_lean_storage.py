"""The lean storage path against the SDK's own calls on the same clients (``tests/storage/
sdk.py``), on real Azurite: the same rows written, the same errors (type, status, error code,
the failing operation's index), the same continuations, each path resuming the other's."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import HttpResponseError
from azure.data.tables import (
    AccountSasPermissions,
    RequestTooLargeError,
    ResourceTypes,
    TableEntity,
    TableTransactionError,
    UpdateMode,
    generate_account_sas,
)

from tests.conftest import unique
from tests.storage.sdk import TABLE_PATHS
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, TransactionOperation, submit_batch, transact
from timeline.storage.names import TIMELINES
from timeline.tools.azurite import ACCOUNT, ACCOUNT_KEY, Azurite

PATHS = list(TABLE_PATHS)
ALL = "PartitionKey eq @pk"


async def read_all(
    storage: Storage,
    partition: str,
    limit: int = 1000,
    select: list[str] | None = None,
    path: str = "lean",
) -> tuple[list[TableEntity], list[dict[str, str] | None]]:
    """Every row of the partition, page by page, and the continuation after each page."""
    rows: list[TableEntity] = []
    tokens: list[dict[str, str] | None] = []
    continuation: dict[str, str] | None = None
    while True:
        page = await TABLE_PATHS[path].query_page(
            storage.reader(TIMELINES, partition),
            ALL,
            {"pk": partition},
            select=select,
            limit=limit,
            continuation=continuation,
        )
        rows += page.items
        tokens.append(page.continuation)
        continuation = page.continuation
        if continuation is None:
            return rows, tokens


def row(partition: str, key: str, **properties: Any) -> dict[str, Any]:
    return {"PartitionKey": partition, "RowKey": key, **properties}


def error_shape(error: HttpResponseError) -> tuple[Any, ...]:
    return (
        type(error),
        error.status_code,
        str(error.error_code),  # type: ignore[attr-defined]
        getattr(error, "index", None),
    )


@pytest.mark.parametrize("path", PATHS)
async def test_a_batch_writes_what_both_paths_read_alike(storage: Storage, path: str) -> None:
    partition = unique("lean")
    operations: list[Operation] = [
        ("upsert", row(partition, f"r{i:03d}", text=f"post {i}", n=i, flag=i % 2 == 0))
        for i in range(100)
    ]
    await TABLE_PATHS[path].submit_batch(storage, TIMELINES, partition, operations)
    lean_rows, _ = await read_all(storage, partition)
    sdk_rows, _ = await read_all(storage, partition, path="sdk")
    assert lean_rows == sdk_rows
    assert [dict(r) for r in lean_rows] == [op[1] for op in operations]
    assert [r.metadata for r in lean_rows] == [r.metadata for r in sdk_rows]


Make = Callable[[str, Storage], Awaitable[list[TransactionOperation]]]


async def failures(storage: Storage, make: Make) -> dict[str, tuple[Any, ...]]:
    """The error each path raises for the transaction ``make`` builds on a partition holding
    one row, ``there``; the failed transaction writes nothing."""
    shapes: dict[str, tuple[Any, ...]] = {}
    for path in PATHS:
        partition = unique("fail")
        await transact(storage, TIMELINES, partition, [("upsert", row(partition, "there"))])
        operations = await make(partition, storage)
        with pytest.raises(HttpResponseError) as caught:
            await TABLE_PATHS[path].transact(storage, TIMELINES, partition, operations)
        shapes[path] = error_shape(caught.value)
        rows, _ = await read_all(storage, partition)
        assert [r["RowKey"] for r in rows] == ["there"], "a failed transaction wrote nothing"
    return shapes


def upserts(partition: str, count: int) -> list[TransactionOperation]:
    return [
        ("upsert", row(partition, f"new{i}"), {"mode": UpdateMode.REPLACE}) for i in range(count)
    ]


async def test_a_missing_delete_fails_at_its_index_alike(storage: Storage) -> None:
    async def make(partition: str, _storage: Storage) -> list[TransactionOperation]:
        missing: TransactionOperation = ("delete", row(partition, "missing"))
        return [*upserts(partition, 3), missing, *upserts(partition, 1)]

    shapes = await failures(storage, make)
    assert shapes["lean"] == shapes["sdk"] == (TableTransactionError, 404, "ResourceNotFound", 3)


async def test_a_create_conflict_fails_at_its_index_alike(storage: Storage) -> None:
    async def make(partition: str, _storage: Storage) -> list[TransactionOperation]:
        return [*upserts(partition, 2), ("create", row(partition, "there"))]

    shapes = await failures(storage, make)
    assert shapes["lean"] == shapes["sdk"] == (TableTransactionError, 409, "EntityAlreadyExists", 2)


async def stale_etag(storage: Storage, partition: str) -> str:
    """The etag of ``there`` before a rewrite: stale from then on."""
    rows, _ = await read_all(storage, partition)
    etag = str(rows[0].metadata["etag"])
    await transact(storage, TIMELINES, partition, [("upsert", row(partition, "there", v=2))])
    return etag


@pytest.mark.parametrize("kind", ["update", "delete"])
async def test_an_etag_mismatch_fails_alike(storage: Storage, kind: str) -> None:
    async def make(partition: str, storage: Storage) -> list[TransactionOperation]:
        condition: dict[str, Any] = {"etag": await stale_etag(storage, partition)}
        condition["match_condition"] = MatchConditions.IfNotModified
        if kind == "update":
            condition["mode"] = UpdateMode.REPLACE
        return [*upserts(partition, 1), (kind, row(partition, "there", v=3), condition)]

    shapes = await failures(storage, make)
    assert shapes["lean"] == shapes["sdk"]
    assert shapes["lean"][:2] == (TableTransactionError, 412)
    assert shapes["lean"][3] == 1


async def test_a_current_etag_updates_and_deletes_alike(storage: Storage) -> None:
    for path in PATHS:
        partition = unique("etag")
        await transact(storage, TIMELINES, partition, [("upsert", row(partition, k)) for k in "ab"])
        rows, _ = await read_all(storage, partition)
        tags = {r["RowKey"]: r.metadata["etag"] for r in rows}
        unchanged = MatchConditions.IfNotModified
        await TABLE_PATHS[path].transact(
            storage,
            TIMELINES,
            partition,
            [
                (
                    "update",
                    row(partition, "a", v=1),
                    {"etag": tags["a"], "match_condition": unchanged},
                ),
                ("delete", row(partition, "b"), {"etag": tags["b"], "match_condition": unchanged}),
            ],
        )
        rows, _ = await read_all(storage, partition)
        assert [dict(r) for r in rows] == [row(partition, "a", v=1)]


async def test_a_body_too_large_fails_alike(storage: Storage) -> None:
    shapes = {}
    for path in PATHS:
        partition = unique("big")
        operations: list[Operation] = [
            ("upsert", row(partition, f"r{i}", text="x" * 45_000)) for i in range(100)
        ]
        with pytest.raises(RequestTooLargeError) as caught:
            await TABLE_PATHS[path].submit_batch(storage, TIMELINES, partition, operations)
        shapes[path] = error_shape(caught.value)
    assert shapes["lean"] == shapes["sdk"]
    assert shapes["lean"][:2] == (RequestTooLargeError, 413)


async def test_missing_deletes_are_dropped_and_the_rest_sent(storage: Storage) -> None:
    partition = unique("drop")
    await submit_batch(
        storage, TIMELINES, partition, [("upsert", row(partition, k)) for k in "abc"]
    )
    deletes: list[Operation] = [("delete", row(partition, k)) for k in ["a", "gone1", "c", "gone2"]]
    await submit_batch(storage, TIMELINES, partition, deletes)
    rows, _ = await read_all(storage, partition)
    assert [r["RowKey"] for r in rows] == ["b"]


@pytest.mark.parametrize("limit", [1000, 333])
async def test_continuations_match_and_resume_across_paths(storage: Storage, limit: int) -> None:
    partition = unique("pages")
    rows: list[Operation] = [("upsert", row(partition, f"r{i:05d}", i=i)) for i in range(1_250)]
    for start in range(0, len(rows), 100):
        await submit_batch(storage, TIMELINES, partition, rows[start : start + 100])
    lean_rows, lean_tokens = await read_all(storage, partition, limit)
    sdk_rows, sdk_tokens = await read_all(storage, partition, limit, path="sdk")
    assert lean_tokens == sdk_tokens
    assert len(lean_tokens) == -(-1_250 // limit)
    assert lean_rows == sdk_rows
    assert len(lean_rows) == 1_250
    # a token one path gave resumes on the other
    token = lean_tokens[0]
    assert token is not None
    for path in PATHS:
        page = await TABLE_PATHS[path].query_page(
            storage.reader(TIMELINES, partition),
            ALL,
            {"pk": partition},
            select=["RowKey"],
            limit=limit,
            continuation=token,
        )
        assert page.items[0]["RowKey"] == f"r{limit:05d}"
        assert list(page.items[0]) == ["RowKey"]


async def test_a_bad_query_fails_alike(storage: Storage) -> None:
    shapes = {}
    for path in PATHS:
        with pytest.raises(HttpResponseError) as caught:
            await TABLE_PATHS[path].query_page(
                storage.reader(TIMELINES, "x"),
                "PartitionKey eq @pk and and",
                {"pk": "x"},
                select=None,
                limit=10,
                continuation=None,
            )
        shapes[path] = error_shape(caught.value)
    assert shapes["lean"] == shapes["sdk"]
    assert shapes["lean"][1] == 400


async def test_a_sas_connection_string_authenticates_the_lean_path(
    azurite: Azurite, storage: Storage
) -> None:
    """The lean path signs nothing itself: a SAS credential (the SDK's policy, its query on
    every URL) works too. (Azurite wants the container resource type for a query.)"""
    sas = generate_account_sas(
        AzureNamedKeyCredential(ACCOUNT, ACCOUNT_KEY),
        resource_types=ResourceTypes(service=True, container=True, object=True),
        permission=AccountSasPermissions(
            read=True, write=True, delete=True, list=True, update=True, add=True
        ),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )
    endpoint = f"http://127.0.0.1:{azurite.ports[2]}/{ACCOUNT}"
    text = f"TableEndpoint={endpoint};SharedAccessSignature={sas}"
    async with Storage(text) as signed:
        partition = unique("sas")
        batch: list[Operation] = [("upsert", row(partition, k)) for k in "abc"]
        await submit_batch(signed, TIMELINES, partition, batch)
        rows, _ = await read_all(signed, partition, limit=2)
    assert [r["RowKey"] for r in rows] == ["a", "b", "c"]
