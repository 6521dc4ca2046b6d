"""Entra ID sign-in, end to end: account URLs and ``DefaultAzureCredential`` against Azurite
over HTTPS with ``--oauth basic``, tokens from a managed identity endpoint, the queues in
an account of their own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.storage.queue import QueueServiceClient

from tests.conftest import api_client, eventually, make_settings, opened, running_worker, unique
from tests.helpers import Api
from tests.storage.entra import IDENTITY_SECRET, IdentityEndpoint, self_signed
from timeline.config import Settings
from timeline.errors import ConfigurationError
from timeline.storage.endpoints import parse_account
from timeline.tools.azurite import Azurite


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secure_azurites(certificate: tuple[Path, Path]) -> Iterator[list[Azurite]]:
    """Two HTTPS Azurites that accept bearer tokens: one for tables, one for queues."""
    servers = [Azurite(location=None, tls=certificate, oauth=True) for _ in range(2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
async def identity(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[IdentityEndpoint]:
    """A managed identity endpoint this process's ``DefaultAzureCredential`` finds."""
    async with IdentityEndpoint().serving() as endpoint:
        monkeypatch.setenv("IDENTITY_ENDPOINT", endpoint.url)
        monkeypatch.setenv("IDENTITY_HEADER", IDENTITY_SECRET)
        yield endpoint


def token_settings(
    servers: list[Azurite], certificate: tuple[Path, Path], tmp_path: Path, **overrides: Any
) -> Settings:
    tables, queues = servers
    return make_settings(
        "",
        tmp_path,
        storage_connection_string=None,
        storage_table_urls=parse_account(tables.connection_string).table.url,
        storage_queue_urls=parse_account(queues.connection_string).queue.url,
        storage_ca_file=certificate[0],
        **overrides,
    )


def queue_names(server: Azurite, certificate: tuple[Path, Path]) -> set[str]:
    """The queues of one Azurite, listed with its account key over HTTPS."""
    with QueueServiceClient.from_connection_string(
        server.connection_string, connection_verify=str(certificate[0])
    ) as client:
        return {queue.name for queue in client.list_queues()}


async def test_round_trip_signed_in_with_entra_id(
    secure_azurites: list[Azurite],
    certificate: tuple[Path, Path],
    identity: IdentityEndpoint,
    tmp_path: Path,
) -> None:
    settings = token_settings(secure_azurites, certificate, tmp_path)
    async with opened(settings), api_client(settings) as client, running_worker(settings):
        api = Api(client)
        author, reader = unique("author"), unique("reader")
        author_token = await api.register(author)
        reader_token = await api.register(reader)
        await api.follow(reader, reader_token, author)
        post = await api.post(author, author_token, "signed in with a token")

        async def delivered() -> bool:
            items: list[dict[str, Any]] = (await api.timeline(reader, reader_token))["items"]
            return items == [post]

        await eventually(delivered, what="the post on the follower's timeline")
    assert set(identity.issued) == {"https://storage.azure.com"}
    # One credential per Storage (set-up, API, worker), its token cached for every client.
    assert len(identity.issued) == 3
    tables, queues = secure_azurites
    assert "fanout-0" in queue_names(queues, certificate)
    assert "fanout-0" not in queue_names(tables, certificate)


async def test_a_token_storage_refuses_stops_the_start(
    secure_azurites: list[Azurite],
    certificate: tuple[Path, Path],
    identity: IdentityEndpoint,
    tmp_path: Path,
) -> None:
    """The token is what signs the requests in: one for another audience is refused."""
    identity.audience = "https://vault.azure.net"
    settings = token_settings(secure_azurites, certificate, tmp_path)
    with pytest.raises(ConfigurationError, match="403"):
        async with opened(settings):
            pass
    assert identity.issued
