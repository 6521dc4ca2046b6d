"""Faults injected at the HTTP transport: a front between storage clients and Azurite's table
(or queue) port that loses, holds, throttles or shortens chosen requests, and counts the
writes it passes on.

Nothing here fakes storage: every request goes to Azurite as it came, unless a test asked
the front to lose it (the connection closes with no answer, as a dropped connection does:
the client sees ``ServiceRequestError``), to answer it ``503 ServerBusy`` (as Azure does
when throttling), to hold it until the test lets it go, or to page a query short (its
``$top`` lowered, as real Azure may end a page early). The clients are the production ones
(a plain ``Storage`` on ``StorageFront.connection_string``), so every fault test runs the
path production runs.

A process names an account by its table endpoint, and the stored placement must name the
same ones: a ``Storage`` behind a front only routes on a placement made through that front.
So a test puts the front before an Azurite of its own (``front`` in ``tests/conftest.py``)
and reaches that storage only through it; the faults are chosen per table.

Tables are told by a request's path (``/{account}/{table}...``); an Entity Group Transaction
(``POST /{account}/$batch``) names its table, and whether it deletes, in the request line
of each operation in its multipart body (``operations``).

A fault that must hit one process alone (a front hits every process behind it, and a
process not behind it names another account) is a hook on that process's own table
connections instead (``Delay``, through ``StorageOptions.trace_configs``), or, for its
placement reads (on its control connections, which carry no hooks), a placement client of
its own on a front that refuses everything (``PlacementCutOff``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import web
from azure.data.tables.aio import TableClient
from yarl import URL

from timeline.storage.accounts import Storage
from timeline.storage.clients import Clients
from timeline.storage.placement import PLACEMENT_TABLE
from timeline.tools.azurite import HOST, Azurite, connection_string

WRITES = frozenset({"POST", "PUT", "MERGE", "PATCH", "DELETE"})
_BATCH_LINE = re.compile(rb"^(GET|POST|PUT|MERGE|PATCH|DELETE) (\S+) HTTP/1\.1\r?$", re.M)
_TOP = re.compile(r"(^|&)(\$top|%24top)=(\d+)", re.I)


def table_of(path: str) -> str:
    """The table (or queue) a request path names: ``/{account}/{name}(...)...``; ``$batch``
    for a transaction, ``Tables`` for the table service's own calls, ``""`` for the
    account's."""
    segments = path.split("?", 1)[0].split("/")
    name = segments[2] if len(segments) > 2 else ""
    return unquote(name.split("(", 1)[0])


def operations(method: str, path: str, body: bytes) -> list[tuple[str, str]]:
    """``(method, table)`` of each operation a request carries: itself, or each request line
    inside a ``$batch`` body."""
    if method == "POST" and table_of(path) == "$batch":
        return [
            (verb.decode(), table_of(urlsplit(url.decode("latin-1")).path))
            for verb, url in _BATCH_LINE.findall(body)
        ]
    return [(method, table_of(path))]


class StorageFront:
    """An HTTP front to Azurite's table (or ``queue``) port; every fault is off until a test
    sets it, and each may be set or cleared at any time.

    ``busy``: the next ``busy`` requests of ``busy_methods`` are answered ``503 ServerBusy``
    (``hits`` counts the requests of those methods, ``request_ids`` keeps their
    ``x-ms-client-request-id``). A lost request is one try: the client resends a ``PUT``,
    ``DELETE`` or ``GET`` (aiohttp once, then its retry policy), and each try is lost again
    for as long as its table is in the set."""

    def __init__(
        self, azurite: Azurite, busy_methods: Iterable[str] = ("PUT",), *, queue: bool = False
    ) -> None:
        self.azurite = azurite
        self.queue = queue
        self.target = f"http://{HOST}:{azurite.ports[1 if queue else 2]}"
        self.port = 0
        self.busy = 0
        self.busy_methods = set(busy_methods)
        self.hits = 0
        self.request_ids: list[str | None] = []
        self.lose_writes: set[str] = set()
        """Tables whose writes (a transaction holding one included) are lost."""
        self.down = False
        """Every request is lost, as an unreachable account's are, but those that only
        touch ``answering`` tables."""
        self.answering: set[str] = set()
        self.hold_writes: set[str] = set()
        """Tables whose writes wait at ``gate`` (``held`` is set once one waits)."""
        self.hold_deletes: set[str] = set()
        """Tables whose deletes (a transaction holding one included) wait at ``gate``."""
        self.hang = False
        """Every request waits at ``gate``, as on a slow account."""
        self.gate = asyncio.Event()
        self.held = asyncio.Event()
        self.holding: Counter[str] = Counter()
        """How many requests wait at ``gate`` now, by table (a transaction's first)."""
        self.written: Counter[str] = Counter()
        """Write operations passed on to storage, by table (each of a transaction's)."""
        self.page_limit: int | None = None
        """Cap on a query's ``$top``: storage then pages short, with a continuation."""
        self._closing = False
        self._session: aiohttp.ClientSession | None = None

    def connection_string(self) -> str:
        """Azurite's, with the fronted service's endpoint on the front."""
        blob, queue, table = self.azurite.ports
        if self.queue:
            return connection_string((blob, self.port, table))
        return connection_string((blob, queue, self.port))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method in self.busy_methods:
            self.hits += 1
            self.request_ids.append(request.headers.get("x-ms-client-request-id"))
            if self.busy > 0:
                self.busy -= 1
                return _busy(self.queue)
        carried = operations(request.method, request.raw_path, body)
        if self._lost(carried):
            return _lose(request)
        if self.hang or self._held(carried):
            self.held.set()
            self.holding[carried[0][1]] += 1
            try:
                await self.gate.wait()
            finally:
                self.holding[carried[0][1]] -= 1
            if self._closing:
                return _lose(request)
        self.written.update(table for method, table in carried if method in WRITES)
        return await self._forward(request, body)

    def _lost(self, carried: list[tuple[str, str]]) -> bool:
        if self.down and any(table not in self.answering for _, table in carried):
            return True
        return any(method in WRITES and table in self.lose_writes for method, table in carried)

    def _held(self, carried: list[tuple[str, str]]) -> bool:
        return any(
            (method in WRITES and table in self.hold_writes)
            or (method == "DELETE" and table in self.hold_deletes)
            for method, table in carried
        )

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        path = request.raw_path
        if self.page_limit is not None and request.method == "GET" and "?" in path:
            route, query = path.split("?", 1)
            path = f"{route}?{_TOP.sub(self._shorter, query)}"
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        assert self._session is not None, "the front is not running"
        async with self._session.request(
            request.method,
            URL(self.target + path, encoded=True),
            headers=headers,
            data=body or None,
            skip_auto_headers=("Content-Type",),
        ) as answer:
            passed = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length", "connection")
            }
            return web.Response(status=answer.status, body=await answer.read(), headers=passed)

    def _shorter(self, match: re.Match[str]) -> str:
        assert self.page_limit is not None
        return f"{match[1]}{match[2]}={min(int(match[3]), self.page_limit)}"

    @asynccontextmanager
    async def running(self) -> AsyncIterator[StorageFront]:
        """Serve on a free port until the block ends; then requests still held are lost."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession(auto_decompress=False)
        try:
            yield self
        finally:
            self._closing = True
            self.gate.set()
            await runner.cleanup()
            await self._session.close()


def _lose(request: web.Request) -> web.Response:
    """Close the connection with no answer (what is returned is never written)."""
    if request.transport is not None:  # None: the client has gone already
        request.transport.abort()
    return web.Response(status=204)


def _busy(queue: bool) -> web.Response:
    """Azure's ``503 ServerBusy``: XML from the queue service, JSON from the table service."""
    if queue:
        body = (
            b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
            b"<Message>busy</Message></Error>"
        )
        content_type = "application/xml"
    else:
        body = b'{"odata.error":{"code":"ServerBusy","message":{"value":"busy"}}}'
        content_type = "application/json"
    headers = {"x-ms-error-code": "ServerBusy", "Content-Type": content_type}
    return web.Response(status=503, body=body, headers=headers)


@asynccontextmanager
async def front_on(
    azurite: Azurite, busy_methods: Iterable[str] = ("PUT",), *, queue: bool = False
) -> AsyncIterator[StorageFront]:
    """A running ``StorageFront`` before ``azurite`` on a free port, stopped on exit."""
    async with StorageFront(azurite, busy_methods, queue=queue).running() as front:
        yield front


class Delay:
    """A slow account for one process: each request of its table connections that
    ``matches`` (method, URL) waits ``seconds`` before it is sent; ``started`` is set when
    the first one waits, ``sent`` keeps when each went on (``time.monotonic``). Given to
    that process as ``StorageOptions(trace_configs=(delay.config(),))``."""

    def __init__(self, seconds: float, matches: Callable[[str, URL], bool]) -> None:
        self.seconds = seconds
        self.matches = matches
        self.started = asyncio.Event()
        self.sent: list[float] = []

    def config(self) -> aiohttp.TraceConfig:
        config = aiohttp.TraceConfig()

        async def starting(
            _session: Any, _context: Any, params: aiohttp.TraceRequestStartParams
        ) -> None:
            if self.matches(params.method, params.url):
                self.started.set()
                await asyncio.sleep(self.seconds)
                self.sent.append(time.monotonic())

        config.on_request_start.append(starting)
        return config


class PlacementCutOff:
    """``cut()`` gives ``storage`` (one process) a placement table client built as its own
    (``Clients``, its options) on an account whose front refuses everything, so its
    placement reads fail as an unreachable home's would, while every other process (the
    admin's) still reads that placement. A front before the home itself cannot do that: it
    would cut off every process behind it, and a process not behind it names another
    account (an account is named by its table endpoint). On exit the process gets its own
    client back."""

    def __init__(self, storage: Storage, home: Azurite) -> None:
        self._storage = storage
        self._home = home
        self._stack = AsyncExitStack()
        self._own: TableClient | None = None
        self._refused: TableClient | None = None

    async def __aenter__(self) -> PlacementCutOff:
        front = await self._stack.enter_async_context(front_on(self._home))
        front.down = True
        clients = Clients([front.connection_string()], self._storage.options)
        clients.open()
        self._stack.push_async_callback(clients.close)
        self._refused = clients.tables[0][PLACEMENT_TABLE]
        return self

    def cut(self) -> None:
        assert self._refused is not None, "not entered"
        tables = self._storage.clients.tables[0]
        self._own = tables[PLACEMENT_TABLE]
        tables[PLACEMENT_TABLE] = self._refused

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._own is not None and self._storage.clients.tables:
            self._storage.clients.tables[0][PLACEMENT_TABLE] = self._own
        await self._stack.aclose()
