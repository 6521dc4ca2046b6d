"""Azure clients for every account, and the one place that routes partitions to accounts."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables import TableEntity, UpdateMode
from azure.data.tables import TableServiceClient as SyncTableServiceClient
from azure.data.tables.aio import TableClient, TableServiceClient
from azure.storage.queue.aio import QueueClient

from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.metrics import STORAGE_REQUESTS, STORAGE_UNAVAILABLE
from timeline.retry import retry_after_of
from timeline.storage.calls import query_page
from timeline.storage.limiter import AdaptiveLimiter, Outcome
from timeline.storage.names import (
    LEGACY_SHARD,
    META_TABLE,
    TABLES,
    background_queue_name,
    poison_queue_name,
    work_queue_name,
)
from timeline.storage.placement import PLACEMENT_KEYS, PLACEMENT_TABLE, Placement, hash64

log = logging.getLogger(__name__)

MEMBER_KEYS = ("member", "placement")
TIMING_KEYS = ("placement", "timing")
"""Beside the placement row: the longest lease and storage timeout of any process."""
CONTROL = "~control"
"""Each account's ``timelineMeta`` client on the control connection pool."""


_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_UNAVAILABLE_ERRORS = (
    TimeoutError,
    ServiceRequestError,
    ServiceResponseError,
    aiohttp.ClientError,
    ConnectionError,
)


_HOLDING: ContextVar[bool] = ContextVar("holding_a_limiter_place", default=False)
"""Set while a call holds a place in the limiter, so a nested call cannot deadlock on it."""


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
    """How long a read of the placement may be routed by (see ``timeline.storage.placement``)."""
    queue_shards: int | None = None
    """Queue shards of a new placement (default: one per account); must match a stored one."""
    limiter: AdaptiveLimiter | None = None
    """Bounds this process's table calls in flight (the worker's; the API runs unbounded)."""


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
    read from storage; see ``timeline.storage.placement`` for why routing stops when that read is
    older than its lease.
    """

    def __init__(
        self, connection_strings: str | Sequence[str], options: StorageOptions | None = None
    ) -> None:
        self._connection_strings = split_connection_strings(connection_strings)
        self.account_ids = tuple(account_id(text) for text in self._connection_strings)
        if len({account.lower() for account in self.account_ids}) != len(self.account_ids):
            raise ConfigurationError("a storage account is listed twice")
        self.options = options or StorageOptions()
        self._session: aiohttp.ClientSession | None = None
        self._queue_session: aiohttp.ClientSession | None = None
        self._control_session: aiohttp.ClientSession | None = None
        self._tables: list[dict[str, TableClient]] = []
        self._queues: dict[str, QueueClient] = {}
        self._placement: Placement | None = None
        self._confirmed = False
        """The account list has passed the membership check and this process's timing is
        recorded; both once per process, before it routes anything."""
        self._valid_until = -math.inf
        self._refused: str | None = None
        self._renewing = asyncio.Lock()
        self._refresher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Storage:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Build the clients and read the placement; raises ``ConfigurationError`` when the
        stored placement does not match the configured accounts. When storage does not
        answer, nothing is routed until it does (the refresher keeps trying)."""
        connector = aiohttp.TCPConnector(limit=self.options.table_connections)
        self._session = aiohttp.ClientSession(connector=connector)
        self._queue_session = aiohttp.ClientSession()
        self._control_session = aiohttp.ClientSession()
        self._tables = [
            {name: self._table_client(text, name) for name in (*TABLES, META_TABLE)}
            for text in self._connection_strings
        ]
        for index, text in enumerate(self._connection_strings):
            self._tables[index][CONTROL] = self._table_client(text, META_TABLE, control=True)
        self._tables[0][PLACEMENT_TABLE] = self._table_client(
            self._connection_strings[0], PLACEMENT_TABLE, control=True
        )
        try:
            with suppress(StorageUnavailableError):
                await self.refresh_placement()
        except HttpResponseError as error:  # e.g. 403: a wrong key
            self._refused = (
                f"storage refused the placement read ({error.status_code}): {error.reason}"
            )
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
        for session in (self._session, self._queue_session, self._control_session):
            if session is not None:
                await session.close()
        self._session = self._queue_session = self._control_session = None

    # -- placement ---------------------------------------------------------------------

    @property
    def placement(self) -> Placement:
        """The stored placement this process routes by (``StorageUnavailableError`` when it
        has none: storage not initialised, or not reachable since the process started)."""
        if self._placement is None:
            raise StorageUnavailableError(
                "the storage placement has not been read yet (is storage initialised? "
                "`timeline init`)",
                retry_after=2,
            )
        return self._placement

    @property
    def queue_shards(self) -> int:
        return self.placement.queue_shards

    async def refresh_placement(self) -> Placement | None:
        """Read the stored placement; the lease counts from when the read started.

        The first time, the accounts are checked and this process's timing recorded
        *before* that read, so no placement is routed by until a rebalance can see how long
        this process may keep routing by it."""
        try:
            if not self._confirmed and not await self._confirm():
                self._placement = None  # not initialised: `create_all` stores one
                return None
            started = time.monotonic()
            entity = await self._control_get(self.placement_table(), PLACEMENT_KEYS)
            if entity is None:
                self._placement = None
                return None
            stored = Placement.from_entity(entity)
            stored.check_configured(self.account_ids, self.options.queue_shards)
        except ConfigurationError as error:
            if self._refused is None:
                log.error("not routing storage requests: %s", error.message)
            self._refused = error.message
            return None
        self._refused = None
        if started + self.options.placement_lease_s > self._valid_until:  # not an older read
            self._placement, self._valid_until = stored, started + self.options.placement_lease_s
        return self._placement

    async def _confirm(self) -> bool:
        """Check the accounts and record this process's timing, once; False when storage
        holds no placement yet. Only the accounts the placement uses are checked here: an
        added one (unreachable, perhaps) is checked by ``create_all`` when it comes in."""
        entity = await self._control_get(self.placement_table(), PLACEMENT_KEYS)
        if entity is None:
            await self._check_membership()  # a misordered list finds no placement first
            return False
        stored = Placement.from_entity(entity)
        stored.check_configured(self.account_ids, self.options.queue_shards)
        await self._check_membership(len(stored.accounts))
        await self._record_timing()
        self._confirmed = True
        return True

    async def read_placement_entity(self) -> TableEntity | None:
        return await self._control_get(self.placement_table(), PLACEMENT_KEYS)

    async def read_timing(self) -> tuple[float, float]:
        """The longest placement lease and storage timeout any process has recorded."""
        entity = await self._control_get(self.placement_table(), TIMING_KEYS)
        if entity is None:
            return self.options.placement_lease_s, self.options.timeout_s
        return float(entity["lease_s"]), float(entity["timeout_s"])

    async def _control_get(self, client: TableClient, keys: tuple[str, str]) -> TableEntity | None:
        async with self.guard(renew=False):
            try:
                return await client.get_entity(*keys)
            except ResourceNotFoundError:
                return None  # the row, or its table (a fresh account), does not exist

    async def _check_membership(self, accounts: int | None = None) -> None:
        """Raise ``ConfigurationError`` for an account (of the first ``accounts``) that
        belongs to another placement home, or that is listed twice under two spellings (the
        same member row twice)."""
        home, seen = self.account_ids[0], set[str]()
        for index, account in enumerate(self._tables[:accounts]):
            member = await self._control_get(account[CONTROL], MEMBER_KEYS)
            if member is None:
                continue  # an added account whose rebalance has not started yet
            if member["home"] != home:
                raise ConfigurationError(
                    f"storage account {self.account_ids[index]} belongs to the placement "
                    f"whose home is {member['home']}, but the first configured account is "
                    f"{home}: list the accounts in the stored order"
                )
            if member.get("id") in seen:
                raise ConfigurationError(
                    f"storage account {self.account_ids[index]} is listed twice (under two "
                    "connection strings)"
                )
            seen.add(member.get("id") or f"unnamed-{index}")

    async def _record_timing(self) -> None:
        """Raise the stored lease and timeout to this process's, before it routes anything:
        a rebalance's fence must outlast the longest of any process."""
        client = self.placement_table()
        for _ in range(10):
            async with self.guard(renew=False):
                try:
                    row = await client.get_entity(*TIMING_KEYS)
                except ResourceNotFoundError:
                    row = None
            lease, timeout = self.options.placement_lease_s, self.options.timeout_s
            if row is not None and row["lease_s"] >= lease and row["timeout_s"] >= timeout:
                return
            entity = {
                "PartitionKey": TIMING_KEYS[0],
                "RowKey": TIMING_KEYS[1],
                "lease_s": max(lease, float(row["lease_s"]) if row else 0.0),
                "timeout_s": max(timeout, float(row["timeout_s"]) if row else 0.0),
            }
            async with self.guard(renew=False):
                try:
                    if row is None:
                        await client.create_entity(entity)
                    else:
                        await client.update_entity(
                            entity,
                            mode=UpdateMode.REPLACE,
                            etag=row.metadata["etag"],
                            match_condition=MatchConditions.IfNotModified,
                        )
                    return
                except (ResourceExistsError, ResourceModifiedError):
                    continue
        raise StorageUnavailableError("could not record this process's timing", retry_after=2)

    async def _refresh_forever(self) -> None:
        period = self.options.placement_lease_s / 3
        while True:
            try:
                await self.refresh_placement()
                await asyncio.sleep(period)
            except Exception as error:  # the refresher must outlive any one failure
                log.warning("could not read the placement: %s", type(error).__name__)
                await asyncio.sleep(min(1.0, period))

    async def _renew_if_expired(self) -> None:
        """Re-read the placement now if this process may not route by the one it has (a
        stalled event loop can starve the refresher past the lease)."""
        if self._placement is not None and time.monotonic() <= self._valid_until:
            return
        async with self._renewing:
            if self._placement is not None and time.monotonic() <= self._valid_until:
                return
            with suppress(StorageUnavailableError):
                await self.refresh_placement()

    async def confirmed_placement(self) -> Placement:
        """The placement, read now if this process has none it may route by; raises
        ``StorageUnavailableError`` (or refuses) when there is none yet."""
        await self._renew_if_expired()
        return self._routable()

    def _routable(self) -> Placement:
        if self._refused is not None:
            raise StorageUnavailableError(self._refused, retry_after=60)
        placement = self.placement
        if time.monotonic() > self._valid_until:
            raise StorageUnavailableError(
                "the storage placement could not be confirmed recently", retry_after=2
            )
        return placement

    def table(self, name: str, partition_key: str) -> TableClient:
        """The client to *write* ``partition_key`` of table ``name`` with, right before the
        request (inside ``guard``); a partition that a rebalance is copying takes no writes
        (a retryable ``StorageUnavailableError``)."""
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

    def _table_client(
        self, connection_string: str, name: str, *, control: bool = False
    ) -> TableClient:
        """A table client; ``control`` ones (placement, membership) have a connection pool
        of their own, so a backlog of timeline writes never starves the placement lease."""
        return TableClient.from_connection_string(
            connection_string,
            name,
            retry_total=self.options.retries,
            retry_backoff_factor=0.2,
            retry_backoff_max=1,
            **self._transport_kwargs(self._control_session if control else None),
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
            if shard == LEGACY_SHARD:
                account = 0
            elif 0 <= shard < self.queue_shards:
                account = self.placement.queue_accounts[shard]
            else:
                raise ValueError(f"no queue shard {shard}")
            self._queues[name] = self._queue_client(self._connection_strings[account], name)
        return self._queues[name]

    def work_queue(self, shard: int) -> QueueClient:
        """Queue shard ``fanout-<shard>``; shards stay on the account they were created on."""
        return self._shard_queue(work_queue_name(shard), shard)

    def poison_queue(self, shard: int) -> QueueClient:
        return self._shard_queue(poison_queue_name(shard), shard)

    def background_queue(self, shard: int) -> QueueClient:
        """Queue shard ``fanout-<shard>-low``, on the account of ``fanout-<shard>``."""
        return self._shard_queue(background_queue_name(shard), shard)

    def _all_queues(self) -> list[QueueClient]:
        shards = range(self.queue_shards)
        return [
            *(self.work_queue(k) for k in shards),
            *(self.background_queue(k) for k in shards),
            *(self.poison_queue(k) for k in shards),
        ]

    async def legacy_queue_exists(self) -> bool:
        """Whether the single ``fanout`` queue of a deployment from before queue shards is
        still there (its messages are consumed beside the shards until it is deleted)."""
        async with self.guard():
            try:
                await self.work_queue(LEGACY_SHARD).get_queue_properties()
            except ResourceNotFoundError:
                return False
        return True

    @asynccontextmanager
    async def guard(
        self,
        timeout_s: float | None = None,
        *,
        renew: bool = True,
        limited: bool = True,
        kind: str = "other",
    ) -> AsyncIterator[None]:
        """Bound a storage call in time and turn outages into ``StorageUnavailableError``;
        first renew the placement if its lease ran out (``renew``).

        With a limiter, a ``limited`` call first waits for a place (untimed: the wait is
        back-pressure, not storage's latency); control calls (``renew=False``) and queue
        calls pass, so leases and the placement never wait behind a backlog. ``kind`` names
        the request's shape for the limiter, which compares latencies within a kind."""
        limiter = self.options.limiter if limited and renew and not _HOLDING.get() else None
        if limiter is None:
            async with self._guarded(timeout_s, renew=renew, outcome=None):
                yield
            return
        holding = _HOLDING.set(True)  # a call made inside this one must not wait for a place
        try:
            async with limiter.slot(kind) as outcome, self._guarded(timeout_s, renew, outcome):
                yield
        finally:
            _HOLDING.reset(holding)

    @asynccontextmanager
    async def _guarded(
        self, timeout_s: float | None, renew: bool, outcome: Outcome | None
    ) -> AsyncIterator[None]:
        STORAGE_REQUESTS.inc()
        try:
            async with asyncio.timeout(timeout_s or self.options.timeout_s):
                if renew:
                    await self._renew_if_expired()
                yield
        except asyncio.CancelledError:
            if outcome is not None:
                outcome.cancelled = True
            raise
        except Exception as error:
            if not is_retryable(error):
                raise
            if outcome is not None:
                outcome.congested, outcome.retry_after = True, retry_after_of(error)
            STORAGE_UNAVAILABLE.inc()
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
            for name, client in account.items():
                if name != CONTROL:
                    async with self.guard(renew=False):
                        with suppress(ResourceExistsError):
                            await client.create_table()
        for account in self._tables:
            await self._ensure_member_row(account[CONTROL])
        await self._check_membership()  # before a placement naming these accounts is stored
        await self._store_initial_placement()
        if await self.refresh_placement() is None:
            raise ConfigurationError(self._refused or "the placement could not be stored")
        for queue in self._all_queues():
            async with self.guard():
                with suppress(ResourceExistsError):
                    await queue.create_queue()

    async def _store_initial_placement(self) -> None:
        """Store this configuration's placement unless one exists. When the first account
        already holds data (a deployment from before several accounts), the placement
        starts on it alone, and ``timeline rebalance`` spreads the data out."""
        if await self.read_placement_entity() is not None:
            return
        accounts = self.account_ids
        if len(accounts) > 1 and await self._holds_data(0):
            log.warning(
                "the first account already holds data: the placement starts on it alone; "
                "run `timeline rebalance` to spread it over all %d accounts",
                len(accounts),
            )
            accounts = accounts[:1]
        shards = self.options.queue_shards or len(self.account_ids)  # fixed once stored
        initial = Placement.initial(accounts, shards)
        async with self.guard(renew=False):
            with suppress(ResourceExistsError):
                await self.placement_table().create_entity(initial.to_entity())

    async def _holds_data(self, account: int) -> bool:
        for name in TABLES:
            async with self.guard(renew=False):
                page = await query_page(
                    self._tables[account][name], "", {}, select=["PartitionKey"], limit=1,
                    continuation=None,
                )  # fmt: skip
            if page.items:
                return True
        return False

    async def _ensure_member_row(self, client: TableClient) -> None:
        """Create the account's member row, or give an old one (without an id) its id."""
        existing = await self._control_get(client, MEMBER_KEYS)
        async with self.guard(renew=False):
            if existing is None:
                with suppress(ResourceExistsError):
                    await client.create_entity(self._member_row())
            elif not existing.get("id"):
                with suppress(ResourceModifiedError):  # another process gave it one
                    await client.update_entity(
                        {**self._member_row(), "home": existing["home"]},
                        mode=UpdateMode.REPLACE,
                        etag=existing.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified,
                    )

    def _member_row(self) -> dict[str, str]:
        partition_key, row_key = MEMBER_KEYS
        return {
            "PartitionKey": partition_key,
            "RowKey": row_key,
            "home": self.account_ids[0],
            "id": uuid.uuid4().hex,
        }

    async def missing_resources(self) -> list[str]:
        """Names of tables and queues that do not exist (raises if storage is unreachable)."""
        missing: list[str] = []
        placement = self._placement or await self.refresh_placement()
        if placement is None:
            return ["placement"]  # (or storage is unreachable: that raises)
        in_use = self._connection_strings[: len(placement.accounts)]
        for index, text in enumerate(in_use):  # an added account waits for its rebalance
            async with self.guard(), self._service_client(text) as service:
                existing = {table.name async for table in service.list_tables()}
            wanted = [*TABLES, META_TABLE, *([PLACEMENT_TABLE] if index == 0 else [])]
            missing += [f"{name} (account {index})" for name in wanted if name not in existing]
        background = {background_queue_name(k) for k in range(self.queue_shards)}
        for queue in self._all_queues():
            if queue.queue_name in background:
                continue  # created on first use by a deployment from before them
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
