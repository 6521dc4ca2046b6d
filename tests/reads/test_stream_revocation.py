"""A live stream ends once its token is revoked, within ``TIMELINE_STREAM_TOKEN_RECHECK_S``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import ClientResponse

from tests.conftest import api_client, make_settings, unique
from tests.helpers import Api, bearer
from timeline.storage.accounts import Storage
from timeline.tools.azurite import Azurite


async def _ended(stream: ClientResponse) -> bool:
    """True when the server closes the stream within 30 s (False: it is still open)."""
    try:
        async with asyncio.timeout(30):
            while await stream.content.readline():
                pass
    except TimeoutError:
        return False
    return True


async def test_revoking_a_token_ends_its_open_stream(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        stream_poll_s=0.1,
        stream_heartbeat_s=1,
        stream_token_recheck_s=0.5,
        credentials_cache_s=0.5,
    )
    async with Storage(settings.connection_string()) as storage:
        await storage.create_all()
    async with api_client(settings) as client:
        api = Api(client)
        user = unique("reader")
        revoked = await api.register(user)
        stream = await client.get(f"/users/{user}/timeline/stream", headers=bearer(revoked))
        assert stream.status == 200
        signed_out = await client.delete(f"/users/{user}/tokens/current", headers=bearer(revoked))
        assert signed_out.status == 204
        assert await _ended(stream), "the revoked token's stream is still open"
        again = await client.get(f"/users/{user}/timeline/stream", headers=bearer(revoked))
        assert again.status == 401
