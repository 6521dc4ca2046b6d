"""Azure clients over one shared aiohttp session, and the one place that routes partitions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import aiohttp
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode
from azure.data.tables.aio import TableClient, TableServiceClient
from azure.storage.queue.aio import QueueClient

from timeline.entities import Page
from timeline.errors import StorageUnavailableError
from timeline.metrics import STORAGE_REQUESTS

log = logging.getLogger(__name__)

USERS = "users"
POSTS = "posts"
TIMELINES = "timelines"
SUBJECT_FOLLOWERS = "subjectFollowers"
SUBJECT_FOLLOWING = "subjectFollowing"
TABLES = (USERS, POSTS, TIMELINES, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING)

FANOUT_QUEUE = "fanout"
POISON_QUEUE = "fanout-poison"
QUEUES = (FANOUT_QUEUE, POISON_QUEUE)

MAX_BATCH_OPERATIONS = 100
"""Entity Group Transactions take at most 100 operations (Azurite breaks above that)."""

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_UNAVAILABLE_ERRORS = (
    TimeoutError,
    ServiceRequestError,
    ServiceResponseError,
    aiohttp.ClientError,
    ConnectionError,
)


@dataclass(frozen=True, slots=True)
class StorageOptions:
    timeout_s: float = 5.0
    retries: int = 2
    table_connections: int = 256
    """Open connections for table calls; queue calls have a pool of their own, so lease
    renewals never wait behind a backlog of timeline writes."""


def is_retryable(error: BaseException) -> bool:
    """True for failures that say nothing about the request itself: outages, throttling."""
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return True
    return isinstance(error, HttpResponseError) and (
        error.status_code is None or error.status_code in _RETRYABLE_STATUS
    )


class Storage:
    """Owns the aiohttp session and every table and queue client built on it.

    ``table(name, partition_key)`` is the single point that maps a partition to a client, so
    spreading partitions over several storage accounts changes only this class.
    """

    def __init__(self, connection_string: str, options: StorageOptions | None = None) -> None:
        self._connection_string = connection_string
        self.options = options or StorageOptions()
        self._session: aiohttp.ClientSession | None = None
        self._queue_session: aiohttp.ClientSession | None = None
        self._tables: dict[str, TableClient] = {}
        self._queues: dict[str, QueueClient] = {}

    async def __aenter__(self) -> Storage:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.options.table_connections)
        self._session = aiohttp.ClientSession(connector=connector)
        self._queue_session = aiohttp.ClientSession()
        self._tables = {name: self._table_client(name) for name in TABLES}
        self._queues = {name: self._queue_client(name) for name in QUEUES}

    async def close(self) -> None:
        clients: list[TableClient | QueueClient] = [*self._tables.values(), *self._queues.values()]
        for client in clients:
            await client.close()
        self._tables.clear()
        self._queues.clear()
        for session in (self._session, self._queue_session):
            if session is not None:
                await session.close()
        self._session = self._queue_session = None

    def _transport_kwargs(self, session: aiohttp.ClientSession | None = None) -> dict[str, Any]:
        session = session or self._session
        assert session is not None, "Storage.open() was not called"
        timeout = self.options.timeout_s
        return {
            "transport": AioHttpTransport(session=session, session_owner=False),
            "connection_timeout": timeout,
            "read_timeout": timeout,
        }

    def _table_client(self, name: str) -> TableClient:
        return TableClient.from_connection_string(
            self._connection_string,
            name,
            retry_total=self.options.retries,
            retry_backoff_factor=0.2,
            retry_backoff_max=1,
            **self._transport_kwargs(),
        )

    def _queue_client(self, name: str) -> QueueClient:
        return QueueClient.from_connection_string(
            self._connection_string,
            name,
            retry_total=self.options.retries,
            initial_backoff=0.5,  # the SDK's default waits 15 s before its first retry
            increment_base=2,
            random_jitter_range=0.5,
            **self._transport_kwargs(self._queue_session),
        )

    def table(self, name: str, partition_key: str) -> TableClient:
        """The client that holds ``partition_key`` of table ``name`` (one account for now)."""
        del partition_key
        return self._tables[name]

    def queue(self, name: str) -> QueueClient:
        return self._queues[name]

    @asynccontextmanager
    async def guard(self, timeout_s: float | None = None) -> AsyncIterator[None]:
        """Bound a storage call in time and turn outages into ``StorageUnavailableError``."""
        STORAGE_REQUESTS.inc()
        try:
            async with asyncio.timeout(timeout_s or self.options.timeout_s):
                yield
        except Exception as error:
            if not is_retryable(error):
                raise
            log.warning("storage unavailable: %s", type(error).__name__)
            raise StorageUnavailableError(
                "storage is unavailable, try again shortly", retry_after=2
            ) from error

    async def create_all(self) -> None:
        """Create every table and queue; existing ones are left as they are."""
        for client in self._tables.values():
            async with self.guard():
                with suppress(ResourceExistsError):
                    await client.create_table()
        for queue in self._queues.values():
            async with self.guard():
                with suppress(ResourceExistsError):
                    await queue.create_queue()

    async def missing_resources(self) -> list[str]:
        """Names of tables and queues that do not exist (raises if storage is unreachable)."""
        async with self.guard(), self._service_client() as service:
            existing = {table.name async for table in service.list_tables()}
        missing = [name for name in TABLES if name not in existing]
        for name, queue in self._queues.items():
            async with self.guard():
                try:
                    await queue.get_queue_properties()
                except HttpResponseError as error:
                    if error.status_code != 404:
                        raise
                    missing.append(name)
        return missing

    def _service_client(self) -> TableServiceClient:
        return TableServiceClient.from_connection_string(
            self._connection_string, retry_total=0, **self._transport_kwargs()
        )


async def query_page(
    client: TableClient,
    query_filter: str,
    parameters: dict[str, Any],
    *,
    select: list[str] | None,
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[TableEntity]:
    """Exactly one storage query: up to ``limit`` entities and the storage continuation."""
    entities: Any = client.query_entities(
        query_filter, parameters=parameters, select=select, results_per_page=limit
    )
    pager = entities.by_page(continuation_token=continuation)  # the SDK's token is a dict
    try:
        page = await pager.__anext__()
    except StopAsyncIteration:
        return Page([], None)
    items = [entity async for entity in page]
    return Page(items, pager.continuation_token or None)


Operation = tuple[str, dict[str, Any]]
"""``("upsert", entity)`` or ``("delete", keys)``: idempotent, so safe to retry."""


async def submit_batch(
    storage: Storage, table: str, partition_key: str, operations: list[Operation]
) -> None:
    """Write ≤ 100 idempotent operations on one partition: a plain call for one, else an EGT.

    Deleting an already-missing row is not an error: inside a batch it fails the whole
    transaction, so that operation is dropped and the rest resent.
    """
    client = storage.table(table, partition_key)
    batch = list(operations)
    while batch:
        async with storage.guard():
            if len(batch) == 1:
                kind, entity = batch[0]
                if kind == "delete":
                    await client.delete_entity(entity["PartitionKey"], entity["RowKey"])
                else:
                    await client.upsert_entity(entity, mode=UpdateMode.REPLACE)
                return
            try:
                await client.submit_transaction([_transaction_operation(op) for op in batch])
                return
            except TableTransactionError as error:
                index = error.index
                if error.status_code != 404 or index is None or batch[index][0] != "delete":
                    raise
                del batch[index]


def _transaction_operation(operation: Operation) -> tuple[Any, ...]:
    kind, entity = operation
    return (kind, entity, {"mode": UpdateMode.REPLACE}) if kind == "upsert" else (kind, entity)


def chunked(items: Iterable[Any], size: int = MAX_BATCH_OPERATIONS) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


TransactionOperation = tuple[Any, ...]
"""An SDK transaction operation: ``(kind, entity)`` or ``(kind, entity, options)``."""


async def transact(
    storage: Storage, table: str, partition_key: str, operations: list[TransactionOperation]
) -> None:
    """One Entity Group Transaction, all or nothing; raises ``TableTransactionError`` with the
    failing operation's index (conflicts and failed conditions are the caller's to judge)."""
    client = storage.table(table, partition_key)
    async with storage.guard():
        await client.submit_transaction(operations)


def failed_index(error: TableTransactionError, *statuses: int) -> int | None:
    """The index of the operation that failed the transaction with one of ``statuses``."""
    return error.index if error.status_code in statuses else None
