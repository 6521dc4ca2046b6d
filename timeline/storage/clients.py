"""The aiohttp sessions and every SDK client built on them, for every account."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
from azure.core.credentials_async import AsyncTokenCredential
from azure.core.pipeline.transport import AioHttpTransport
from azure.data.tables.aio import TableClient, TableServiceClient
from azure.storage.queue.aio import QueueClient

from timeline.storage.endpoints import Account, Side, parse_account
from timeline.storage.names import META_TABLE, TABLES
from timeline.storage.placement import PLACEMENT_TABLE

if TYPE_CHECKING:
    from timeline.storage.accounts import StorageOptions

CONTROL = "~control"
"""Each account's ``timelineMeta`` client on the control connection pool."""


class Clients:
    """Owns the aiohttp sessions and the table and queue clients of every account.

    Three connection pools: table calls; queue calls, so lease renewals never wait behind a
    backlog of timeline writes; and control calls (placement, membership), so that backlog
    never starves the placement lease either."""

    def __init__(self, accounts: Sequence[Account | str], options: StorageOptions) -> None:
        self._accounts = [
            account if isinstance(account, Account) else parse_account(account)
            for account in accounts
        ]
        self._options = options
        self._credential: AsyncTokenCredential | None = None
        """The Entra ID token credential, when an account signs in with one."""
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
        tls = _tls_context(self._options.ca_file)
        connector = aiohttp.TCPConnector(limit=self._options.table_connections, ssl=tls)
        self._session = aiohttp.ClientSession(
            connector=connector, trace_configs=list(self._options.trace_configs)
        )
        self._queue_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls))
        self._control_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls))
        if any(account.uses_token for account in self._accounts):
            # Entra ID as every Azure SDK user gets it: environment, workload identity,
            # managed identity, then the developer's ``az login`` (imported here: only
            # token accounts need it).
            from azure.identity.aio import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
        self.tables = [
            {name: self._table_client(account.table, name) for name in (*TABLES, META_TABLE)}
            for account in self._accounts
        ]
        for index, account in enumerate(self._accounts):
            self.tables[index][CONTROL] = self._table_client(
                account.table, META_TABLE, control=True
            )
        self.tables[0][PLACEMENT_TABLE] = self._table_client(
            self._accounts[0].table, PLACEMENT_TABLE, control=True
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
        if self._credential is not None:
            await self._credential.close()
            self._credential = None

    def queue_client(self, account: int, name: str) -> QueueClient:
        side = self._accounts[account].queue
        options: dict[str, Any] = {
            "retry_total": self._options.retries,
            "initial_backoff": 0.5,  # the SDK's default waits 15 s before its first retry
            "increment_base": 2,
            "random_jitter_range": 0.5,
            **self._transport_kwargs(self._queue_session),
        }
        if side.connection_string is not None:
            return QueueClient.from_connection_string(side.connection_string, name, **options)
        return QueueClient(side.url, name, credential=self._credential, **options)

    def service_client(self, account: int) -> TableServiceClient:
        side = self._accounts[account].table
        options = {"retry_total": 0, **self._transport_kwargs()}
        if side.connection_string is not None:
            return TableServiceClient.from_connection_string(side.connection_string, **options)
        return TableServiceClient(side.url, credential=self._credential, **options)

    def _transport_kwargs(self, session: aiohttp.ClientSession | None = None) -> dict[str, Any]:
        session = session or self._session
        assert session is not None, "Storage.open() was not called"
        timeout = self._options.timeout_s
        return {
            "transport": AioHttpTransport(session=session, session_owner=False),
            "connection_timeout": timeout,
            "read_timeout": timeout,
        }

    def _table_client(self, side: Side, name: str, *, control: bool = False) -> TableClient:
        """A table client; ``control`` ones (placement, membership) have a connection pool
        of their own, so a backlog of timeline writes never starves the placement lease."""
        options: dict[str, Any] = {
            "retry_total": self._options.retries,
            "retry_backoff_factor": 0.2,
            "retry_backoff_max": 1,
            **self._transport_kwargs(self._control_session if control else None),
        }
        if side.connection_string is not None:
            return TableClient.from_connection_string(side.connection_string, name, **options)
        return TableClient(side.url, name, credential=self._credential, **options)


def _tls_context(ca_file: str | None) -> ssl.SSLContext | bool:
    """The system's trusted CAs, plus ``ca_file`` when one is configured (a private CA, or
    an Azurite over HTTPS with a self-signed certificate)."""
    if ca_file is None:
        return True
    context = ssl.create_default_context()
    context.load_verify_locations(cafile=ca_file)
    return context
