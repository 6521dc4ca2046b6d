"""The lean storage path against the SDK's own calls, on real Azurite: the same rows written,
the same errors (type, status, error code, the failing operation's index), the same
continuations; and the switch that picks the path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
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
from azure.data.tables.aio import TableClient

from tests.conftest import unique
from timeline.config import Settings
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from timeline.storage.calls import (
    Operation,
    TransactionOperation,
    query_page,
    submit_batch,
    transact,
)
from timeline.storage.clients import RoutedTableClient
from timeline.storage.names import TIMELINES

PATHS = ["lean", "sdk"]
ALL = "PartitionKey eq @pk"


@pytest.fixture(scope="module")
async def paths(settings: Settings, storage: Storage) -> AsyncIterator[dict[str, Storage]]:
    """One ``Storage`` per path on the session's Azurite (its tables already created)."""
    text = settings.connection_string()
    async with (
        Storage(text, StorageOptions(lean=True)) as lean,
        Storage(text, StorageOptions(lean=False)) as sdk,
    ):
        yield {"lean": lean, "sdk": sdk}


async def read_all(
    storage: Storage, partition: str, limit: int = 1000, select: list[str] | None = None
) -> tuple[list[TableEntity], list[dict[str, str] | None]]:
    """Every row of the partition, page by page, and the continuation after each page."""
    rows: list[TableEntity] = []
    tokens: list[dict[str, str] | None] = []
    continuation: dict[str, str] | None = None
    while True:
        page = await query_page(
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
async def test_a_batch_writes_what_both_paths_read_alike(
    paths: dict[str, Storage], path: str
) -> None:
    partition = unique("lean")
    operations: list[Operation] = [
        ("upsert", row(partition, f"r{i:03d}", text=f"post {i}", n=i, flag=i % 2 == 0))
        for i in range(100)
    ]
    await submit_batch(paths[path], TIMELINES, partition, operations)
    lean_rows, _ = await read_all(paths["lean"], partition)
    sdk_rows, _ = await read_all(paths["sdk"], partition)
    assert lean_rows == sdk_rows
    assert [dict(r) for r in lean_rows] == [op[1] for op in operations]
    assert [r.metadata for r in lean_rows] == [r.metadata for r in sdk_rows]


Make = Callable[[str, Storage], Awaitable[list[TransactionOperation]]]


async def failures(paths: dict[str, Storage], make: Make) -> dict[str, tuple[Any, ...]]:
    """The error each path raises for the transaction ``make`` builds on a partition holding
    one row, ``there``; the failed transaction writes nothing."""
    shapes: dict[str, tuple[Any, ...]] = {}
    for path, storage in paths.items():
        partition = unique("fail")
        await transact(storage, TIMELINES, partition, [("upsert", row(partition, "there"))])
        operations = await make(partition, storage)
        with pytest.raises(HttpResponseError) as caught:
            await transact(storage, TIMELINES, partition, operations)
        shapes[path] = error_shape(caught.value)
        rows, _ = await read_all(storage, partition)
        assert [r["RowKey"] for r in rows] == ["there"], "a failed transaction wrote nothing"
    return shapes


def upserts(partition: str, count: int) -> list[TransactionOperation]:
    return [
        ("upsert", row(partition, f"new{i}"), {"mode": UpdateMode.REPLACE}) for i in range(count)
    ]


async def test_a_missing_delete_fails_at_its_index_alike(paths: dict[str, Storage]) -> None:
    async def make(partition: str, _storage: Storage) -> list[TransactionOperation]:
        missing: TransactionOperation = ("delete", row(partition, "missing"))
        return [*upserts(partition, 3), missing, *upserts(partition, 1)]

    shapes = await failures(paths, make)
    assert shapes["lean"] == shapes["sdk"] == (TableTransactionError, 404, "ResourceNotFound", 3)


async def test_a_create_conflict_fails_at_its_index_alike(paths: dict[str, Storage]) -> None:
    async def make(partition: str, _storage: Storage) -> list[TransactionOperation]:
        return [*upserts(partition, 2), ("create", row(partition, "there"))]

    shapes = await failures(paths, make)
    assert shapes["lean"] == shapes["sdk"] == (TableTransactionError, 409, "EntityAlreadyExists", 2)


async def stale_etag(storage: Storage, partition: str) -> str:
    """The etag of ``there`` before a rewrite: stale from then on."""
    rows, _ = await read_all(storage, partition)
    etag = str(rows[0].metadata["etag"])
    await transact(storage, TIMELINES, partition, [("upsert", row(partition, "there", v=2))])
    return etag


@pytest.mark.parametrize("kind", ["update", "delete"])
async def test_an_etag_mismatch_fails_alike(paths: dict[str, Storage], kind: str) -> None:
    async def make(partition: str, storage: Storage) -> list[TransactionOperation]:
        condition: dict[str, Any] = {"etag": await stale_etag(storage, partition)}
        condition["match_condition"] = MatchConditions.IfNotModified
        if kind == "update":
            condition["mode"] = UpdateMode.REPLACE
        return [*upserts(partition, 1), (kind, row(partition, "there", v=3), condition)]

    shapes = await failures(paths, make)
    assert shapes["lean"] == shapes["sdk"]
    assert shapes["lean"][:2] == (TableTransactionError, 412)
    assert shapes["lean"][3] == 1


async def test_a_current_etag_updates_and_deletes_alike(paths: dict[str, Storage]) -> None:
    for storage in paths.values():
        partition = unique("etag")
        await transact(storage, TIMELINES, partition, [("upsert", row(partition, k)) for k in "ab"])
        rows, _ = await read_all(storage, partition)
        tags = {r["RowKey"]: r.metadata["etag"] for r in rows}
        unchanged = MatchConditions.IfNotModified
        await transact(
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


async def test_a_body_too_large_fails_alike(paths: dict[str, Storage]) -> None:
    shapes = {}
    for path, storage in paths.items():
        partition = unique("big")
        operations: list[Operation] = [
            ("upsert", row(partition, f"r{i}", text="x" * 45_000)) for i in range(100)
        ]
        with pytest.raises(RequestTooLargeError) as caught:
            await submit_batch(storage, TIMELINES, partition, operations)
        shapes[path] = error_shape(caught.value)
    assert shapes["lean"] == shapes["sdk"]
    assert shapes["lean"][:2] == (RequestTooLargeError, 413)


@pytest.mark.parametrize("path", PATHS)
async def test_missing_deletes_are_dropped_and_the_rest_sent(
    paths: dict[str, Storage], path: str
) -> None:
    partition = unique("drop")
    storage = paths[path]
    await submit_batch(
        storage, TIMELINES, partition, [("upsert", row(partition, k)) for k in "abc"]
    )
    deletes: list[Operation] = [("delete", row(partition, k)) for k in ["a", "gone1", "c", "gone2"]]
    await submit_batch(storage, TIMELINES, partition, deletes)
    rows, _ = await read_all(storage, partition)
    assert [r["RowKey"] for r in rows] == ["b"]


@pytest.mark.parametrize("limit", [1000, 333])
async def test_continuations_match_and_resume_across_paths(
    paths: dict[str, Storage], limit: int
) -> None:
    partition = unique("pages")
    rows = [("upsert", row(partition, f"r{i:05d}", i=i)) for i in range(1_250)]
    for start in range(0, len(rows), 100):
        await submit_batch(paths["sdk"], TIMELINES, partition, rows[start : start + 100])
    lean_rows, lean_tokens = await read_all(paths["lean"], partition, limit)
    sdk_rows, sdk_tokens = await read_all(paths["sdk"], partition, limit)
    assert lean_tokens == sdk_tokens
    assert len(lean_tokens) == -(-1_250 // limit)
    assert lean_rows == sdk_rows
    assert len(lean_rows) == 1_250
    # a token one path gave resumes on the other
    token = lean_tokens[0]
    assert token is not None
    for storage in paths.values():
        page = await query_page(
            storage.reader(TIMELINES, partition),
            ALL,
            {"pk": partition},
            select=["RowKey"],
            limit=limit,
            continuation=token,
        )
        assert page.items[0]["RowKey"] == f"r{limit:05d}"
        assert list(page.items[0]) == ["RowKey"]


async def test_a_bad_query_fails_alike(paths: dict[str, Storage]) -> None:
    shapes = {}
    for path, storage in paths.items():
        with pytest.raises(HttpResponseError) as caught:
            await query_page(
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


async def test_the_switch_picks_the_path(
    paths: dict[str, Storage], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's ``submit_transaction`` and ``query_entities`` run only with lean off."""
    calls: list[str] = []
    for name in ("submit_transaction", "query_entities"):
        original = getattr(TableClient, name)

        def spy(
            self: TableClient, *args: Any, _name: str = name, _f: Any = original, **kw: Any
        ) -> Any:
            calls.append(_name)
            return _f(self, *args, **kw)

        monkeypatch.setattr(TableClient, name, spy)
    for path, storage in paths.items():
        calls.clear()
        partition = unique("switch")
        await transact(storage, TIMELINES, partition, [("upsert", row(partition, k)) for k in "ab"])
        await read_all(storage, partition)
        expected = [] if path == "lean" else ["submit_transaction", "query_entities"]
        assert calls == expected, path


def test_lean_is_on_by_default_and_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIMELINE_STORAGE_LEAN", raising=False)
    assert Settings().storage_options().lean is True
    monkeypatch.setenv("TIMELINE_STORAGE_LEAN", "false")
    assert Settings().storage_options().lean is False


async def test_clients_carry_the_switch(paths: dict[str, Storage]) -> None:
    for path, storage in paths.items():
        client = storage.table(TIMELINES, "x")
        assert isinstance(client, RoutedTableClient)
        assert client.lean is (path == "lean")


@pytest.mark.parametrize("path", PATHS)
async def test_a_sas_connection_string_authenticates_both_paths(
    azurite: Azurite, storage: Storage, path: str
) -> None:
    """The lean path signs nothing itself: a SAS credential (the SDK's policy) works too.
    (Azurite wants the container resource type for a query, on either path.)"""
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
    async with Storage(text, StorageOptions(lean=path == "lean")) as signed:
        client = signed.table(TIMELINES, "x")
        assert isinstance(client, RoutedTableClient)
        assert client.lean is (path == "lean")
        partition = unique("sas")
        batch: list[Operation] = [("upsert", row(partition, k)) for k in "abc"]
        await submit_batch(signed, TIMELINES, partition, batch)
        rows, _ = await read_all(signed, partition, limit=2)
    assert [r["RowKey"] for r in rows] == ["a", "b", "c"]
