"""Fault injection in front of a real storage account: fail, hold or shorten chosen calls.

Nothing here fakes storage: every call still goes to Azurite, unless a test asked for that
call to fail (as a lost connection does) or to wait until the test lets it go.

A proxy of a table client sees two kinds of call: the SDK's own methods (``upsert_entity``,
``query_entities``, ...), and the lean requests ``timeline.storage.calls`` sends, which go
through the client's ``lean_sender``: a proxy's ``HookedSender`` names each by the SDK call
whose work it does (``sdk_call``), so one filter sees both.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

from azure.core.exceptions import ServiceRequestError
from azure.core.rest import AsyncHttpResponse, HttpRequest
from azure.data.tables.aio import TableClient

from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.wire import lean

WRITES = frozenset(
    {"create_entity", "upsert_entity", "update_entity", "delete_entity", "submit_transaction"}
)
DELETES = frozenset({"delete_entity", "submit_transaction"})
READS = frozenset({"get_entity", "query_entities", "list_entities"})


def sdk_call(request: HttpRequest) -> str:
    """The SDK table call whose work a lean request does."""
    path = urlsplit(request.url).path
    if path.endswith("/$batch"):
        return "submit_transaction"
    if request.method == "GET":
        return "query_entities" if path.endswith("()") else "get_entity"
    if request.method == "POST":
        return "create_entity"
    if request.method == "DELETE":
        return "delete_entity"
    return "update_entity" if "If-Match" in request.headers else "upsert_entity"


def entities_written(request: HttpRequest) -> int:
    """The entities a lean write request writes: a batch's operations, else one."""
    if sdk_call(request) != "submit_transaction":
        return 1
    return bytes(request.content).count(b"\r\nContent-ID: ")


class HookedSender:
    """A table client's lean sender that first awaits ``hook(sdk_call(request), request)``
    (once per call: the client's retries are inside the sender)."""

    def __init__(
        self, client: TableClient, hook: Callable[[str, HttpRequest], Awaitable[None]]
    ) -> None:
        self._sender = lean.sender(client)
        self._hook = hook

    async def send(self, request: HttpRequest) -> AsyncHttpResponse:
        await self._hook(sdk_call(request), request)
        return await self._sender.send(request)


class FaultyStorage(Storage):
    """A ``Storage`` whose table calls can be failed, held at a gate, or paged short."""

    def __init__(self, connection_string: str, options: StorageOptions | None = None) -> None:
        super().__init__(connection_string, options)
        self.tables_down = False
        """Every table call fails as an unreachable account would (the placement, read on
        its own connection pool, still answers)."""
        self.fail_writes: Counter[str] = Counter()
        """Table name -> how many of its next write calls fail as a lost connection would."""
        self.held_tables: set[str] = set()
        """Tables whose deletes wait at ``gate`` (``held`` is set once one is waiting)."""
        self.gate = asyncio.Event()
        self.held = asyncio.Event()
        self.page_limit: int | None = None
        """Cap on ``results_per_page``: storage then pages short, as real Azure may."""

    async def __aenter__(self) -> FaultyStorage:
        await self.open()
        return self

    def table(self, name: str, partition_key: str) -> TableClient:
        return cast(TableClient, _TableProxy(super().table(name, partition_key), name, self))

    def reader(self, name: str, partition_key: str) -> TableClient:
        return cast(TableClient, _TableProxy(super().reader(name, partition_key), name, self))


class _TableProxy:
    def __init__(self, client: TableClient, table: str, faults: FaultyStorage) -> None:
        self._client = client
        self._table = table
        self._faults = faults

    @property
    def lean_sender(self) -> HookedSender:
        return HookedSender(self._client, self._before_lean)

    async def _before_lean(self, name: str, request: HttpRequest) -> None:
        if self._faults.tables_down:
            raise ServiceRequestError(f"injected: {self._table} is unreachable")
        if name in WRITES:
            await self._before_write(name)
        limit = self._faults.page_limit
        if name == "query_entities" and limit is not None:
            request.url = re.sub(
                r"([?&]\$top=)(\d+)", lambda m: f"{m[1]}{min(limit, int(m[2]))}", request.url
            )

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if self._faults.tables_down and name in WRITES | READS:
            raise ServiceRequestError(f"injected: {self._table} is unreachable")
        if name == "query_entities":
            return self._query
        if name not in WRITES:
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            await self._before_write(name)
            return await attribute(*args, **kwargs)

        return call

    async def _before_write(self, method: str) -> None:
        faults = self._faults
        if faults.fail_writes[self._table] > 0:
            faults.fail_writes[self._table] -= 1
            raise ServiceRequestError(f"injected: {self._table}.{method} lost its connection")
        if self._table in faults.held_tables and method in DELETES:
            faults.held.set()
            await faults.gate.wait()

    def _query(self, *args: Any, **kwargs: Any) -> Any:
        limit = self._faults.page_limit
        if limit is not None:
            kwargs["results_per_page"] = min(limit, kwargs.get("results_per_page") or limit)
        return self._client.query_entities(*args, **kwargs)


class UnreachableTable:
    """A table client whose every call fails as an unreachable account would (e.g. the
    placement table of a placement home this process cannot reach any more)."""

    def __init__(self, client: TableClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        if name == "close":
            return self._client.close

        def unreachable(*_args: Any, **_kwargs: Any) -> Any:
            raise ServiceRequestError("injected: the account is unreachable")

        return unreachable
