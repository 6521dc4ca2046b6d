"""Azure clients for every account, and the one place that routes partitions to accounts."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import aiohttp
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode
from azure.data.tables import TableServiceClient as SyncTableServiceClient
from azure.data.tables.aio import TableClient, TableServiceClient
from azure.storage.queue.aio import QueueClient

from timeline.entities import Page
from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.metrics import STORAGE_REQUESTS
from timeline.placement import PLACEMENT_KEYS, PLACEMENT_TABLE, Placement, hash64

log = logging.getLogger(__name__)

USERS = "users"
POSTS = "posts"
TIMELINES = "timelines"
SUBJECT_FOLLOWERS = "subjectFollowers"
SUBJECT_FOLLOWING = "subjectFollowing"
RATE_LIMITS = "rateLimits"
TABLES = (USERS, POSTS, TIMELINES, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, RATE_LIMITS)
"""Tables whose partitions are spread over the accounts by ``timeline.placement``."""
META_TABLE = "timelineMeta"
"""Service-wide rows (the auth secret) on the placement home, beside ``placement``; on every
account, the row naming the placement home it belongs to."""
MEMBER_KEYS = ("member", "placement")

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


def work_queue_name(shard: int) -> str:
    return f"fanout-{shard}"


def poison_queue_name(shard: int) -> str:
    return f"fanout-{shard}-poison"


def split_connection_strings(text: str | Sequence[str]) -> tuple[str, ...]:
    """Connection strings separated by whitespace or newlines (they never contain any)."""
    parts = text.split() if isinstance(text, str) else [part.strip() for part in text]
    strings = tuple(part for part in parts if part)
    if not strings:
        raise ConfigurationError("no storage connection string was given")
    if len(set(strings)) != len(strings):
        raise ConfigurationError("a storage connection string is listed twice")
    return strings


def account_id(connection_string: str) -> str:
    """What names an account in the stored placement: its table endpoint, never its key."""
    try:
        client = SyncTableServiceClient.from_connection_string(connection_string)
    except ValueError as error:
        raise ConfigurationError(f"a storage connection string is not valid: {error}") from None
    with client:
        return str(client.url).rstrip("/")


@dataclass(frozen=True, slots=True)
class StorageOptions:
    timeout_s: float = 5.0
    retries: int = 2
    table_connections: int = 256
    """Open connections for table calls; queue calls have a pool of their own, so lease
    renewals never wait behind a backlog of timeline writes."""
    placement_lease_s: float = 15.0
    """How long a read of the placement may be routed by (see ``timeline.placement``)."""
    queue_shards: int | None = None
    """Queue shards of a new placement (default: one per account); must match a stored one."""


def is_retryable(error: BaseException) -> bool:
    """True for failures that say nothing about the request itself: outages, throttling."""
    if isinstance(error, _UNAVAILABLE_ERRORS):
        return True
    return isinstance(error, HttpResponseError) and (
        error.status_code is None or error.status_code in _RETRYABLE_STATUS
    )


class Storage:
    """Owns the aiohttp sessions and every table and queue client of every account.

    ``table(name, partition_key)`` (for writes) and ``reader(name, partition_key)`` are the
    single points that map a partition to an account, by the placement this process last
    read from storage; see ``timeline.placement`` for why routing stops when that read is
    older than its lease.
    """

    def __init__(
        self, connection_strings: str | Sequence[str], options: StorageOptions | None = None
    ) -> None:
        self._connection_strings = split_connection_strings(connection_strings)
        self.account_ids = tuple(account_id(text) for text in self._connection_strings)
        self.options = options or StorageOptions()
        self._session: aiohttp.ClientSession | None = None
        self._queue_session: aiohttp.ClientSession | None = None
        self._tables: list[dict[str, TableClient]] = []
        self._queues: dict[str, QueueClient] = {}
        self._placement = Placement.initial(
            self.account_ids, self.options.queue_shards or len(self.account_ids)
        )
        self._stored = False
        self._valid_until = -math.inf
        self._refused: str | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Storage:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Build the clients and read the placement; raises ``ConfigurationError`` when the
        stored placement does not match the configured accounts."""
        connector = aiohttp.TCPConnector(limit=self.options.table_connections)
        self._session = aiohttp.ClientSession(connector=connector)
        self._queue_session = aiohttp.ClientSession()
        self._tables = [
            {name: self._table_client(text, name) for name in (*TABLES, META_TABLE)}
            for text in self._connection_strings
        ]
        self._tables[0][PLACEMENT_TABLE] = self._table_client(
            self._connection_strings[0], PLACEMENT_TABLE
        )
        with suppress(StorageUnavailableError):
            await self.refresh_placement()
            await self._check_membership()
        if self._refused is not None:
            await self.close()
            raise ConfigurationError(self._refused)
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        clients: list[TableClient | QueueClient] = [
            *(client for account in self._tables for client in account.values()),
            *self._queues.values(),
        ]
        for client in clients:
            await client.close()
        self._tables.clear()
        self._queues.clear()
        for session in (self._session, self._queue_session):
            if session is not None:
                await session.close()
        self._session = self._queue_session = None

    # -- placement ---------------------------------------------------------------------

    @property
    def placement(self) -> Placement:
        return self._placement

    @property
    def queue_shards(self) -> int:
        return self._placement.queue_shards

    async def refresh_placement(self) -> Placement:
        """Read the stored placement; the lease counts from when the read started."""
        started = time.monotonic()
        entity = await self.read_placement_entity()
        if entity is not None:
            self._adopt(Placement.from_entity(entity))
        self._valid_until = started + self.options.placement_lease_s
        return self._placement

    async def read_placement_entity(self) -> TableEntity | None:
        client = self._tables[0][PLACEMENT_TABLE]
        async with self.guard():
            try:
                return await client.get_entity(*PLACEMENT_KEYS)
            except ResourceNotFoundError:
                return None  # a fresh storage: `create_all` writes the configured placement

    def _adopt(self, stored: Placement) -> None:
        try:
            stored.check_configured(self.account_ids, self.options.queue_shards)
        except ConfigurationError as error:
            if self._refused is None:
                log.error("not routing storage requests any more: %s", error.message)
            self._refused = error.message
            return
        self._refused = None
        self._placement, self._stored = stored, True

    async def _check_membership(self) -> None:
        """Refuse accounts that belong to the placement of another placement home: a list
        in the wrong order would otherwise find no placement on its first account."""
        home = self.account_ids[0]
        for index, account in enumerate(self._tables):
            async with self.guard():
                try:
                    member = await account[META_TABLE].get_entity(*MEMBER_KEYS)
                except ResourceNotFoundError:
                    continue
            if member["home"] != home:
                self._refused = (
                    f"storage account {self.account_ids[index]} belongs to the placement whose "
                    f"home is {member['home']}, but the first configured account is {home}: "
                    "list the accounts in the stored order"
                )
                return

    async def _refresh_forever(self) -> None:
        period = self.options.placement_lease_s / 3
        while True:
            try:
                await self.refresh_placement()
                await asyncio.sleep(period)
            except Exception as error:  # the refresher must outlive any one failure
                log.warning("could not read the placement: %s", type(error).__name__)
                await asyncio.sleep(min(1.0, period))

    def _routable(self) -> Placement:
        if self._refused is not None:
            raise StorageUnavailableError(self._refused, retry_after=60)
        if time.monotonic() > self._valid_until:
            raise StorageUnavailableError(
                "the storage placement could not be confirmed recently", retry_after=2
            )
        return self._placement

    def table(self, name: str, partition_key: str) -> TableClient:
        """The client to *write* ``partition_key`` of table ``name`` with; a partition that a
        rebalance is copying takes no writes (a retryable ``StorageUnavailableError``)."""
        placement, key_hash = self._routable(), hash64(partition_key)
        if not placement.writable(key_hash):
            raise StorageUnavailableError(
                "this partition is moving to another storage account", retry_after=5
            )
        return self._tables[placement.home(key_hash)][name]

    def reader(self, name: str, partition_key: str) -> TableClient:
        """The client to *read* ``partition_key`` of table ``name`` with (also mid-move)."""
        placement = self._routable()
        return self._tables[placement.home(hash64(partition_key))][name]

    def account_table(self, account: int, name: str) -> TableClient:
        """Table ``name`` of one account, for whole-table scans and for the rebalancer."""
        return self._tables[account][name]

    def meta_table(self) -> TableClient:
        return self._tables[0][META_TABLE]

    def placement_table(self) -> TableClient:
        return self._tables[0][PLACEMENT_TABLE]

    # -- clients -----------------------------------------------------------------------

    def _transport_kwargs(self, session: aiohttp.ClientSession | None = None) -> dict[str, Any]:
        session = session or self._session
        assert session is not None, "Storage.open() was not called"
        timeout = self.options.timeout_s
        return {
            "transport": AioHttpTransport(session=session, session_owner=False),
            "connection_timeout": timeout,
            "read_timeout": timeout,
        }

    def _table_client(self, connection_string: str, name: str) -> TableClient:
        return TableClient.from_connection_string(
            connection_string,
            name,
            retry_total=self.options.retries,
            retry_backoff_factor=0.2,
            retry_backoff_max=1,
            **self._transport_kwargs(),
        )

    def _queue_client(self, connection_string: str, name: str) -> QueueClient:
        return QueueClient.from_connection_string(
            connection_string,
            name,
            retry_total=self.options.retries,
            initial_backoff=0.5,  # the SDK's default waits 15 s before its first retry
            increment_base=2,
            random_jitter_range=0.5,
            **self._transport_kwargs(self._queue_session),
        )

    def _shard_queue(self, name: str, shard: int) -> QueueClient:
        if name not in self._queues:
            if not 0 <= shard < self.queue_shards:
                raise ValueError(f"no queue shard {shard}")
            account = self._placement.queue_accounts[shard]
            self._queues[name] = self._queue_client(self._connection_strings[account], name)
        return self._queues[name]

    def work_queue(self, shard: int) -> QueueClient:
        """Queue shard ``fanout-<shard>``; shards stay on the account they were created on."""
        return self._shard_queue(work_queue_name(shard), shard)

    def poison_queue(self, shard: int) -> QueueClient:
        return self._shard_queue(poison_queue_name(shard), shard)

    def _all_queues(self) -> list[QueueClient]:
        shards = range(self.queue_shards)
        return [*(self.work_queue(k) for k in shards), *(self.poison_queue(k) for k in shards)]

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

    # -- provisioning ------------------------------------------------------------------

    async def create_all(self) -> None:
        """Create every table, the placement (when there is none) and every queue shard;
        existing ones are left as they are. Raises ``ConfigurationError`` when the stored
        placement does not match this configuration."""
        for account in self._tables:
            for client in account.values():
                async with self.guard():
                    with suppress(ResourceExistsError):
                        await client.create_table()
        await self._store_initial_placement()
        for account in self._tables:
            async with self.guard():
                with suppress(ResourceExistsError):
                    await account[META_TABLE].create_entity(self._member_row())
        await self._check_membership()
        if self._refused is not None:
            raise ConfigurationError(self._refused)
        for queue in self._all_queues():
            async with self.guard():
                with suppress(ResourceExistsError):
                    await queue.create_queue()

    async def _store_initial_placement(self) -> None:
        async with self.guard():
            with suppress(ResourceExistsError):
                await self.placement_table().create_entity(self._placement.to_entity())
        await self.refresh_placement()
        if self._refused is not None:
            raise ConfigurationError(self._refused)

    def _member_row(self) -> dict[str, str]:
        partition_key, row_key = MEMBER_KEYS
        return {"PartitionKey": partition_key, "RowKey": row_key, "home": self.account_ids[0]}

    async def missing_resources(self) -> list[str]:
        """Names of tables and queues that do not exist (raises if storage is unreachable)."""
        missing: list[str] = []
        in_use = self._connection_strings[: len(self._placement.accounts)]
        for index, text in enumerate(in_use):  # an added account waits for its rebalance
            async with self.guard(), self._service_client(text) as service:
                existing = {table.name async for table in service.list_tables()}
            wanted = [*TABLES, META_TABLE, *([PLACEMENT_TABLE] if index == 0 else [])]
            missing += [f"{name} (account {index})" for name in wanted if name not in existing]
        if not self._stored:
            missing.append("placement")
        for queue in self._all_queues():
            async with self.guard():
                try:
                    await queue.get_queue_properties()
                except HttpResponseError as error:
                    if error.status_code != 404:
                        raise
                    missing.append(queue.queue_name)
        return missing

    def _service_client(self, connection_string: str) -> TableServiceClient:
        return TableServiceClient.from_connection_string(
            connection_string, retry_total=0, **self._transport_kwargs()
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
