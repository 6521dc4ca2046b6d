"""The aiohttp sessions and every SDK client built on them, for every account."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableClient, TableServiceClient
from azure.storage.queue.aio import QueueClient

from timeline.storage.names import META_TABLE, TABLES
from timeline.storage.placement import PLACEMENT_TABLE

if TYPE_CHECKING:
    from timeline.storage.accounts import StorageOptions

CONTROL = "~control"
"""Each account's ``timelineMeta`` client on the control connection pool."""


class RoutedTableClient(TableClient):
    """A table client that knows whether its queries, batches and single-entity calls take
    the lean path (``timeline.storage.lean``, ``lean_single``) or the SDK's own calls."""

    lean = False


class RoutedQueueClient(QueueClient):
    """A queue client that knows whether its receives, sends, updates and deletes take the
    lean path (``timeline.storage.lean_queue``) or the SDK's own calls."""

    lean = False


class Clients:
    """Owns the aiohttp sessions and the table and queue clients of every account.

    Three connection pools: table calls; queue calls, so lease renewals never wait behind a
    backlog of timeline writes; and control calls (placement, membership), so that backlog
    never starves the placement lease either."""

    def __init__(self, connection_strings: Sequence[str], options: StorageOptions) -> None:
        self._connection_strings = connection_strings
        self._options = options
        self._session: aiohttp.ClientSession | None = None
        self._queue_session: aiohttp.ClientSession | None = None
        self._control_session: aiohttp.ClientSession | None = None
        self.tables: list[dict[str, TableClient]] = []
        """Per account, its table clients by table name (and ``CONTROL``; the first account
        also holds ``PLACEMENT_TABLE``)."""
        self.queues: dict[str, QueueClient] = {}
        """Queue clients by queue name, built on first use."""

    def open(self) -> None:
        """Build the sessions and every table client."""
        connector = aiohttp.TCPConnector(limit=self._options.table_connections)
        self._session = aiohttp.ClientSession(
            connector=connector, trace_configs=list(self._options.trace_configs)
        )
        self._queue_session = aiohttp.ClientSession()
        self._control_session = aiohttp.ClientSession()
        self.tables = [
            {name: self._table_client(text, name) for name in (*TABLES, META_TABLE)}
            for text in self._connection_strings
        ]
        for index, text in enumerate(self._connection_strings):
            self.tables[index][CONTROL] = self._table_client(text, META_TABLE, control=True)
        self.tables[0][PLACEMENT_TABLE] = self._table_client(
            self._connection_strings[0], PLACEMENT_TABLE, control=True
        )

    async def close(self) -> None:
        clients: list[TableClient | QueueClient] = [
            *(client for account in self.tables for client in account.values()),
            *self.queues.values(),
        ]
        for client in clients:
            await client.close()
        self.tables.clear()
        self.queues.clear()
        for session in (self._session, self._queue_session, self._control_session):
            if session is not None:
                await session.close()
        self._session = self._queue_session = self._control_session = None

    def queue_client(self, account: int, name: str) -> QueueClient:
        client = RoutedQueueClient.from_connection_string(
            self._connection_strings[account],
            name,
            retry_total=self._options.retries,
            initial_backoff=0.5,  # the SDK's default waits 15 s before its first retry
            increment_base=2,
            random_jitter_range=0.5,
            **self._transport_kwargs(self._queue_session),
        )
        assert isinstance(client, RoutedQueueClient)
        client.lean = self._options.lean
        return client

    def service_client(self, account: int) -> TableServiceClient:
        return TableServiceClient.from_connection_string(
            self._connection_strings[account], retry_total=0, **self._transport_kwargs()
        )

    def _transport_kwargs(self, session: aiohttp.ClientSession | None = None) -> dict[str, Any]:
        session = session or self._session
        assert session is not None, "Storage.open() was not called"
        timeout = self._options.timeout_s
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
        client = RoutedTableClient.from_connection_string(
            connection_string,
            name,
            retry_total=self._options.retries,
            retry_backoff_factor=0.2,
            retry_backoff_max=1,
            **self._transport_kwargs(self._control_session if control else None),
        )
        assert isinstance(client, RoutedTableClient)
        client.lean = self._options.lean
        return client
