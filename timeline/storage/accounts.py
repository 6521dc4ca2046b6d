"""Storage: every account's clients, and the one place that routes partitions to accounts."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass

import aiohttp
from azure.core.exceptions import HttpResponseError
from azure.data.tables import TableEntity
from azure.data.tables.aio import TableClient
from azure.storage.queue.aio import QueueClient

from timeline.errors import ConfigurationError, StorageUnavailableError
from timeline.storage import provisioning
from timeline.storage.clients import Clients
from timeline.storage.endpoints import parse_account
from timeline.storage.flow.guard import guarded
from timeline.storage.flow.limiter import AdaptiveLimiter
from timeline.storage.lease import PlacementLease, control_get
from timeline.storage.names import (
    META_TABLE,
    background_queue_name,
    poison_queue_name,
    work_queue_name,
)
from timeline.storage.placement import PLACEMENT_KEYS, PLACEMENT_TABLE, Placement, hash64


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
        return parse_account(connection_string).id
    except ValueError as error:
        raise ConfigurationError(f"a storage connection string is not valid: {error}") from None


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
    trace_configs: tuple[aiohttp.TraceConfig, ...] = ()
    """Hooks on every HTTP request of table calls (tests and benchmarks count requests)."""
    ca_file: str | None = None
    """A CA certificate (PEM) trusted for storage's HTTPS beside the system's."""


class Storage:
    """Every table and queue client of every account, and the one place that routes a
    partition to its account.

    ``table(name, partition_key)`` (for writes) and ``reader(name, partition_key)`` are the
    single points that map a partition to an account, by the placement this process last
    read from storage; see ``timeline.storage.placement`` for why routing stops when that read is
    older than its lease. The parts live beside it: the clients and their connection pools
    (``clients``), the placement lease (``lease``), the guard around every call (``guard``)
    and provisioning (``provisioning``).
    """

    def __init__(
        self, connection_strings: str | Sequence[str], options: StorageOptions | None = None
    ) -> None:
        strings = split_connection_strings(connection_strings)
        self.account_ids = tuple(account_id(text) for text in strings)
        if len({account.lower() for account in self.account_ids}) != len(self.account_ids):
            raise ConfigurationError("a storage account is listed twice")
        self.options = options or StorageOptions()
        self.clients = Clients([parse_account(text) for text in strings], self.options)
        self.lease = PlacementLease(self)

    async def __aenter__(self) -> Storage:
        await self.open()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Build the clients and read the placement; raises ``ConfigurationError`` when the
        stored placement does not match the configured accounts. When storage does not
        answer, nothing is routed until it does (the refresher keeps trying)."""
        self.clients.open()
        try:
            with suppress(StorageUnavailableError):
                await self.refresh_placement()
        except HttpResponseError as error:  # e.g. 403: a wrong key
            self.lease.refused = (
                f"storage refused the placement read ({error.status_code}): {error.reason}"
            )
        if self.lease.refused is not None:
            await self.close()
            raise ConfigurationError(self.lease.refused)
        self.lease.start()

    async def close(self) -> None:
        await self.lease.stop()
        await self.clients.close()

    # -- placement ---------------------------------------------------------------------

    @property
    def placement(self) -> Placement:
        """The stored placement this process routes by (``StorageUnavailableError`` when it
        has none: storage not initialised, or not reachable since the process started)."""
        return self.lease.placement

    @property
    def queue_shards(self) -> int:
        return self.placement.queue_shards

    async def refresh_placement(self) -> Placement | None:
        """Read the stored placement now (see ``PlacementLease.refresh``)."""
        return await self.lease.refresh()

    async def read_placement_entity(self) -> TableEntity | None:
        return await control_get(self, self.placement_table(), PLACEMENT_KEYS)

    async def confirmed_placement(self) -> Placement:
        """The placement, read now if this process has none it may route by; raises
        ``StorageUnavailableError`` (or refuses) when there is none yet."""
        await self.lease.renew_if_expired()
        return self.lease.routable()

    def table(self, name: str, partition_key: str) -> TableClient:
        """The client to *write* ``partition_key`` of table ``name`` with, right before the
        request (inside ``guard``); a partition that a rebalance is copying takes no writes
        (a retryable ``StorageUnavailableError``)."""
        placement, key_hash = self.lease.routable(), hash64(partition_key)
        if not placement.writable(key_hash):
            raise StorageUnavailableError(
                "this partition is moving to another storage account", retry_after=5
            )
        return self.clients.tables[placement.home(key_hash)][name]

    def reader(self, name: str, partition_key: str) -> TableClient:
        """The client to *read* ``partition_key`` of table ``name`` with (also mid-move)."""
        placement = self.lease.routable()
        return self.clients.tables[placement.home(hash64(partition_key))][name]

    def account_table(self, account: int, name: str) -> TableClient:
        """Table ``name`` of one account, for whole-table scans and for the rebalancer."""
        return self.clients.tables[account][name]

    def meta_table(self) -> TableClient:
        return self.clients.tables[0][META_TABLE]

    def placement_table(self) -> TableClient:
        return self.clients.tables[0][PLACEMENT_TABLE]

    # -- queues ------------------------------------------------------------------------

    def _shard_queue(self, name: str, shard: int) -> QueueClient:
        queues = self.clients.queues
        if name not in queues:
            if not 0 <= shard < self.queue_shards:
                raise ValueError(f"no queue shard {shard}")
            queues[name] = self.clients.queue_client(self.placement.queue_accounts[shard], name)
        return queues[name]

    def work_queue(self, shard: int) -> QueueClient:
        """Queue shard ``fanout-<shard>``; shards stay on the account they were created on."""
        return self._shard_queue(work_queue_name(shard), shard)

    def poison_queue(self, shard: int) -> QueueClient:
        return self._shard_queue(poison_queue_name(shard), shard)

    def background_queue(self, shard: int) -> QueueClient:
        """Queue shard ``fanout-<shard>-low``, on the account of ``fanout-<shard>``."""
        return self._shard_queue(background_queue_name(shard), shard)

    def all_queues(self) -> list[QueueClient]:
        shards = range(self.queue_shards)
        return [
            *(self.work_queue(k) for k in shards),
            *(self.background_queue(k) for k in shards),
            *(self.poison_queue(k) for k in shards),
        ]

    # -- calls and provisioning --------------------------------------------------------

    def guard(
        self,
        timeout_s: float | None = None,
        *,
        renew: bool = True,
        limited: bool = True,
        kind: str = "other",
        not_after: float | None = None,
    ) -> AbstractAsyncContextManager[None]:
        """Bound a storage call in time and turn outages into ``StorageUnavailableError``;
        first renew the placement if its lease ran out (``renew``).

        With a limiter, a ``limited`` call first waits for a place (untimed: the wait is
        back-pressure, not storage's latency); control calls (``renew=False``) and queue
        calls pass, so leases and the placement never wait behind a backlog. ``kind`` names
        the request's shape for the limiter, which compares latencies within a kind. With
        ``not_after`` (``time.monotonic``), a call not sent by then (its place in the limiter
        came later) is refused with ``StorageUnavailableError``: from its start, every try
        (the client's retries included) ends within the timeout."""
        return guarded(
            timeout_s or self.options.timeout_s,
            self.lease.renew_if_expired if renew else None,
            self.options.limiter if limited else None,
            kind,
            not_after,
        )

    async def create_all(self) -> None:
        """Create every table, the placement (when there is none) and every queue shard;
        existing ones are left as they are. Raises ``ConfigurationError`` when the stored
        placement does not match this configuration."""
        await provisioning.create_all(self)

    async def missing_resources(self) -> list[str]:
        """Names of tables and queues that do not exist (raises if storage is unreachable)."""
        return await provisioning.missing_resources(self)
