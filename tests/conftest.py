"""Fixtures: real Azurites, the app on aiohttp's test server, a real worker.

Storage: one in-memory Azurite for the session, shared by the tests that leave its queues to
the session's worker (each uses user ids of its own); and a pool of in-memory Azurites, kept
for the session and lent to one test at a time, emptied before each loan, for the tests that
need storage of their own (an empty queue, no worker beside them, several accounts, a stop or
a freeze).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient

from api.app import create_app
from fanout_worker.metrics import MESSAGES
from fanout_worker.worker import Worker
from tests.faults import StorageFront, front_on
from timeline.config import Settings
from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

TEST_SECRET = "test-secret-not-for-production"


def make_settings(connection_string: str, data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "storage_connection_string": connection_string,
        "data_dir": data_dir,
        "auth_secret": TEST_SECRET,
        "posts_per_minute": 0,
        "writes_per_minute": 0,
        "registrations_per_minute": 0,
        "worker_write_deadline_s": 10.0,
        "worker_sweep_delay_s": 16.0,
        "worker_retry_base_s": 0.1,
        "worker_retry_cap_s": 2.0,
        "storage_timeout_s": 5.0,
        "worker_idle_sleep_s": 0.05,
        "worker_idle_max_sleep_s": 0.05,
        "worker_visibility_timeout_s": 10,
        "worker_shutdown_grace_s": 5.0,
    }
    values.update(overrides)
    return Settings(**values)


def program_env(**settings: object) -> dict[str, str]:
    """This process's environment minus any ``TIMELINE_*``, plus ``settings`` as
    ``TIMELINE_*`` variables: how tests configure the programs they spawn."""
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("TIMELINE_")}
    return inherited | {f"TIMELINE_{name.upper()}": str(value) for name, value in settings.items()}


def unique(prefix: str = "u") -> str:
    """A user id no other test uses, so tests share one storage without interfering."""
    return f"{prefix}-{secrets.token_hex(5)}"


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it holds: fan-out is asynchronous by contract. A check that finds
    storage unavailable (a call past its timeout on a loaded machine) is asked again."""
    deadline = time.monotonic() + timeout_s
    while not await _holds(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


async def _holds(check: Callable[[], Awaitable[bool]]) -> bool:
    try:
        return await check()
    except StorageUnavailableError:
        return False


def messages_done(kind: str) -> float:
    """How many messages of ``kind`` this process's workers have completed."""
    return float(MESSAGES.labels(kind, "done")._value.get())


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    server = Azurite(location=None)
    server.start()
    yield server
    server.stop()


class AzuritePool:
    """In-memory Azurites lent to one test at a time and emptied (every table and queue
    deleted) before each loan: an emptying takes about 0.06 s where a start takes 1.5 to 3 s.
    A test may stop, kill or freeze what it borrowed: the next loan thaws it (SIGCONT) or
    starts it again. What a failed test borrowed is never lent again (``settle``)."""

    def __init__(self) -> None:
        self._idle: list[Azurite] = []
        self._lent: list[Azurite] = []
        self._returned: list[tuple[Azurite, int]] = []
        self._quarantined: list[Azurite] = []
        POOLS.append(self)

    def lend(self, count: int) -> list[Azurite]:
        servers: list[Azurite] = []
        for _ in range(count):
            server = self._idle.pop() if self._idle else None
            try:
                servers.append(self._ready(server))
            except BaseException:  # none of them is lent: stop them all, as close() would
                for taken in [*servers, *([server] if server else [])]:
                    _thaw_and_stop(taken)
                raise
        self._lent += servers
        return servers

    def give_back(self, servers: list[Azurite], failures_at_loan: int) -> None:
        """Take ``servers`` back; ``settle`` decides, once the test's teardown is reported,
        whether they are lent again."""
        for server in servers:
            self._lent.remove(server)
            self._returned.append((server, failures_at_loan))

    def settle(self) -> None:
        """Keep what came back for later loans, unless a test failed since it was lent (in
        its call, set-up or teardown): what that test left running may still write to it, so
        it is frozen until the session ends, its ports held, and never lent again."""
        for server, failures_at_loan in self._returned:
            if len(FAILED) == failures_at_loan:
                self._idle.append(server)
            else:
                server.signal(signal.SIGSTOP)
                self._quarantined.append(server)
        self._returned.clear()

    def close(self) -> None:
        returned = [server for server, _ in self._returned]
        for server in self._idle + self._lent + returned + self._quarantined:
            _thaw_and_stop(server)

    def _ready(self, server: Azurite | None) -> Azurite:
        if server is not None:
            server.signal(signal.SIGCONT)
            if server.running or self._restarted(server):
                empty(server)
                return server
        fresh = Azurite(location=None)
        fresh.start()
        return fresh

    def _restarted(self, server: Azurite) -> bool:
        """Start a server the last test stopped, on its own ports if they are still free."""
        server.stop()
        try:
            server.start()
        except ConfigurationError:
            return False
        return True


def _thaw_and_stop(server: Azurite) -> None:
    """Stop ``server`` even if a test froze it (SIGTERM waits for a SIGCONT)."""
    server.signal(signal.SIGCONT)
    server.stop()


def empty(server: Azurite) -> None:
    """Delete every table and queue of ``server``: what a fresh in-memory Azurite holds."""
    tables = TableServiceClient.from_connection_string(server.connection_string)
    queues = QueueServiceClient.from_connection_string(server.connection_string)
    with tables, queues:
        for table in tables.list_tables():
            tables.delete_table(table.name)
        for queue in queues.list_queues():
            queues.delete_queue(queue.name)


@pytest.fixture(scope="session")
def azurite_pool() -> Iterator[AzuritePool]:
    pool = AzuritePool()
    yield pool
    pool.close()


FAILED: list[str] = []
"""The tests of this process that have failed so far, in any phase."""
POOLS: list[AzuritePool] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        FAILED.append(item.nodeid)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # every fixture of the test is finalized and judged
        for pool in POOLS:
            pool.settle()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An async test's body is cancelled at 0.8 of its pytest-timeout (which, with
    ``timeout_func_only``, times the body alone): the timeout's signal alone fails the test
    but leaves its coroutine running in the session's event loop, beside the tests after it,
    until the session ends."""
    for item in items:
        if isinstance(item, pytest.Function) and inspect.iscoroutinefunction(item.obj):
            limit = timeout_of(item)
            if limit > 0:
                item.obj = _cancelled_after(item.obj, 0.8 * limit)


def timeout_of(item: pytest.Item) -> float:
    """The item's pytest-timeout limit as pytest-timeout resolves it (0: none): the marker,
    else ``--timeout``, else ``PYTEST_TIMEOUT``, else the ini's ``timeout``."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        value = marker.args[0] if marker.args else marker.kwargs["timeout"]
    else:
        value = (
            item.config.getoption("timeout", None)
            or os.environ.get("PYTEST_TIMEOUT")
            or item.config.getini("timeout")
        )
    return float(value or 0)


def _cancelled_after(
    test: Callable[..., Awaitable[Any]], seconds: float
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> Any:
        async with asyncio.timeout(seconds):
            return await test(*args, **kwargs)

    return bounded


@contextlib.contextmanager
def azurites(pool: AzuritePool, count: int) -> Iterator[list[Azurite]]:
    """``count`` empty in-memory Azurites of a test's own: one storage account each. After a
    failure they are not lent again."""
    failures_at_loan = len(FAILED)
    servers = pool.lend(count)
    try:
        yield servers
    finally:
        pool.give_back(servers, failures_at_loan)


@pytest.fixture
def private_azurite(azurite_pool: AzuritePool) -> Iterator[Azurite]:
    """An empty Azurite of one test's own: no worker consumes its queues."""
    with azurites(azurite_pool, 1) as (server,):
        yield server


@pytest.fixture
def two_azurites(azurite_pool: AzuritePool) -> Iterator[list[Azurite]]:
    with azurites(azurite_pool, 2) as servers:
        yield servers


@pytest.fixture
def three_azurites(azurite_pool: AzuritePool) -> Iterator[list[Azurite]]:
    with azurites(azurite_pool, 3) as servers:
        yield servers


@contextlib.asynccontextmanager
async def storage_on(servers: list[Azurite], **options: Any) -> AsyncIterator[Storage]:
    """A ``Storage`` over these Azurites, in this order, with these ``StorageOptions``."""
    strings = [server.connection_string for server in servers]
    async with Storage(strings, StorageOptions(**options)) as storage:
        yield storage


@pytest.fixture
async def own(private_azurite: Azurite) -> AsyncIterator[Storage]:
    """An initialised ``Storage`` on an Azurite of the test's own."""
    async with storage_on([private_azurite]) as storage:
        await provisioned(storage)
        yield storage


@pytest.fixture
async def front(private_azurite: Azurite) -> AsyncIterator[StorageFront]:
    """A ``StorageFront`` (``tests/faults.py``) before an empty Azurite of the test's own,
    whose storage the test makes and reaches only through it."""
    async with front_on(private_azurite) as started:
        yield started


@pytest.fixture
async def fronted(front: StorageFront) -> AsyncIterator[Storage]:
    """An initialised ``Storage`` through ``front``, with the default options."""
    async with Storage(front.connection_string()) as storage:
        await provisioned(storage)
        yield storage


@pytest.fixture(scope="session")
def settings(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return make_settings(azurite.connection_string, tmp_path_factory.mktemp("data"))


@contextlib.asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[Storage]:
    """A ``Storage`` on these settings, every table and queue created."""
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await provisioned(storage)
        yield storage


async def provisioned(storage: Storage, attempts: int = 3) -> None:
    """``storage.create_all()`` (idempotent), tried again after the storage stalls: a test's
    set-up is not what it tests, and CI once met a pooled Azurite that left a set-up's first
    Create Table unanswered for the whole 5 s timeout."""
    for attempt in range(1, attempts + 1):
        try:
            await storage.create_all()
            return
        except StorageUnavailableError:
            if attempt == attempts:
                raise


@pytest.fixture(scope="session")
async def storage(settings: Settings) -> AsyncIterator[Storage]:
    async with opened(settings) as created:
        yield created


@pytest.fixture(scope="session")
def repos(storage: Storage) -> Repositories:
    return Repositories.on(storage)


@pytest.fixture(scope="session")
def queue(storage: Storage) -> FanoutQueue:
    return FanoutQueue(storage)


@contextlib.asynccontextmanager
async def api_client(settings: Settings) -> AsyncIterator[TestClient[Any, Any]]:
    app = create_app(settings, settings.connection_string())
    async with TestClient(TestServer(app)) as client:
        yield client


@pytest.fixture(scope="session")
async def client(settings: Settings, storage: Storage) -> AsyncIterator[TestClient[Any, Any]]:
    async with api_client(settings) as started:
        yield started


@contextlib.asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[Worker]:
    worker = Worker(settings, settings.connection_string())
    task = asyncio.create_task(worker.async_run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


@pytest.fixture(scope="session")
async def worker(settings: Settings, storage: Storage) -> AsyncIterator[Worker]:
    """One real worker consuming the session's queue for every flow test."""
    async with running_worker(settings) as running:
        yield running
