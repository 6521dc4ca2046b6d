"""The live-stream tests' set-up: the API and a worker on an Azurite of the test's own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from tests.conftest import (
    api_client,
    eventually,
    make_settings,
    provisioned,
    running_worker,
    unique,
)
from tests.helpers import Api, bearer
from timeline.storage.accounts import Storage
from timeline.tables.audience import MERGED
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

THRESHOLD = 3
LOOKBACK_S = 300
"""Longer than any test here, so a resumed stream's window holds every post it made."""


@dataclass
class Live:
    client: TestClient[Any, Any]
    api: Api
    storage: Storage
    repos: Repositories
    tokens: dict[str, str]

    async def user(self, prefix: str) -> str:
        user = unique(prefix)
        self.tokens[user] = await self.api.register(user)
        return user

    async def post(self, author: str, text: str = "hello") -> str:
        return str((await self.api.post(author, self.tokens[author], text))["post_id"])

    async def page(self, reader: str, **params: Any) -> dict[str, Any]:
        return await self.api.timeline(reader, self.tokens[reader], **params)

    async def newer(self, reader: str, since: str, limit: int = 250) -> list[list[str]]:
        """Every page of a newer-than read, as post ids."""
        pages: list[list[str]] = []
        continuation = None
        while True:
            page = await self.page(reader, since=since, limit=limit, continuation=continuation)
            pages.append([item["post_id"] for item in page["items"]])
            continuation = page["continuation"]
            if continuation is None:
                return pages

    async def shows(self, reader: str, post_ids: list[str]) -> None:
        async def landed() -> bool:
            page = await self.page(reader)
            return [item["post_id"] for item in page["items"][: len(post_ids)]] == post_ids

        await eventually(landed, what=f"{post_ids} on top of {reader}'s timeline")

    async def stream(self, reader: str, **headers: str) -> ClientResponse:
        return await self.client.get(
            f"/users/{reader}/timeline/stream", headers=bearer(self.tokens[reader]) | headers
        )


@pytest.fixture
async def live(private_azurite: Azurite, tmp_path: Path) -> AsyncIterator[Live]:
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        fanout_on_read_followers=THRESHOLD,
        stream_poll_s=0.1,
        stream_heartbeat_s=1,
        stream_lookback_s=LOOKBACK_S,
        max_streams=3,
        max_streams_per_user=2,
    )
    async with Storage(settings.connection_string()) as storage:
        await provisioned(storage)
        async with api_client(settings) as client, running_worker(settings):
            yield Live(client, Api(client), storage, Repositories.on(storage), {})


async def merged_author(live: Live) -> str:
    """An author whose posts reach readers merged at read time, not copied."""
    author = await live.user("large")
    for _ in range(THRESHOLD):
        fan = await live.user("fan")
        await live.api.follow(fan, live.tokens[fan], author)

    async def merged() -> bool:
        return (await live.repos.audience.mode(author)).state == MERGED

    await eventually(merged, timeout_s=60, what=f"{author} merged")
    return author
