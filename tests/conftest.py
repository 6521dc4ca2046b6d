"""Fixtures: a real Azurite per test session, the app on aiohttp's test server, a real worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from api.app import create_app
from fanout_worker.metrics import MESSAGES
from fanout_worker.worker import Worker
from timeline.config import Settings
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.azurite import Azurite
from timeline.storage.queue import FanoutQueue
from timeline.tables.repositories import Repositories

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
        "worker_arrival_window_s": 3.0,
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
    """Poll ``check`` until it holds: fan-out is asynchronous by contract."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.05)


def messages_done(kind: str) -> float:
    """How many messages of ``kind`` this process's workers have completed."""
    return float(MESSAGES.labels(kind, "done")._value.get())


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    server = Azurite(location=None)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_azurite() -> Iterator[Azurite]:
    """An Azurite of one test's own, for tests that need an empty queue."""
    server = Azurite(location=None)
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def azurites(count: int) -> Iterator[list[Azurite]]:
    """``count`` in-memory Azurites of a test's own: one storage account each."""
    servers = [Azurite(location=None) for _ in range(count)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def two_azurites() -> Iterator[list[Azurite]]:
    with azurites(2) as servers:
        yield servers


@pytest.fixture
def three_azurites() -> Iterator[list[Azurite]]:
    with azurites(3) as servers:
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
        await storage.create_all()
        yield storage


@pytest.fixture(scope="session")
def settings(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return make_settings(azurite.connection_string, tmp_path_factory.mktemp("data"))


@contextlib.asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[Storage]:
    """A ``Storage`` on these settings, every table and queue created."""
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        yield storage


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
