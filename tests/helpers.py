"""A small typed client for the REST API, checking every body against its documented model."""

from __future__ import annotations

from typing import Any

from aiohttp import ClientResponse, ClientSession
from aiohttp.test_utils import TestClient
from azure.storage.queue import QueueMessage
from pydantic import BaseModel

from api import schemas
from timeline.model.entities import Post
from timeline.storage.accounts import Storage
from timeline.storage.calls import Operation, chunked, query_page, submit_batch
from timeline.storage.names import TIMELINES
from timeline.storage.queue import FanoutQueue
from timeline.tables.traces import TRACE_BOUNDS, TRACE_RANGE


async def body_of(response: ClientResponse, model: type[BaseModel] | None = None) -> Any:
    """The JSON body; validated strictly against ``model`` (the OpenAPI source) if given."""
    data = await response.json()
    if model is not None:
        model.model_validate(data)
    return data


async def error_of(response: ClientResponse, status: int) -> str:
    """Assert an error response of ``status`` with the contract's body; return its code."""
    assert response.status == status, await response.text()
    data = await body_of(response, schemas.ErrorBody)
    assert data["error"]["message"]
    return str(data["error"]["code"])


async def put_copies(storage: Storage, owner: str, posts: list[Post]) -> None:
    """Copies of ``posts`` in ``owner``'s timeline, written straight to the table (none of the
    fan-out's checks), 100 upserts per transaction."""
    operations: list[Operation] = [("upsert", post.to_entity(owner)) for post in posts]
    for batch in chunked(operations):
        await submit_batch(storage, TIMELINES, owner, batch)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Api:
    def __init__(self, client: TestClient[Any, Any] | ClientSession) -> None:
        self.client = client

    async def register(self, user_id: str, display_name: str | None = None) -> str:
        payload: dict[str, Any] = {"user_id": user_id}
        if display_name is not None:
            payload["display_name"] = display_name
        response = await self.client.post("/users", json=payload)
        assert response.status == 201, await response.text()
        return str((await body_of(response, schemas.Registered))["token"])

    async def post(self, user_id: str, token: str, text: str) -> dict[str, Any]:
        response = await self.client.post(
            f"/users/{user_id}/posts", json={"text": text}, headers=bearer(token)
        )
        assert response.status == 202, await response.text()
        data: dict[str, Any] = await body_of(response, schemas.PostOut)
        return data

    async def follow(self, user_id: str, token: str, target: str) -> None:
        response = await self.client.put(
            f"/users/{user_id}/following/{target}", headers=bearer(token)
        )
        assert response.status == 204, await response.text()

    async def unfollow(self, user_id: str, token: str, target: str) -> None:
        response = await self.client.delete(
            f"/users/{user_id}/following/{target}", headers=bearer(token)
        )
        assert response.status == 204, await response.text()

    async def timeline(
        self,
        user_id: str,
        token: str,
        *,
        limit: int | None = None,
        continuation: str | None = None,
        since: str | None = None,
    ) -> dict[str, Any]:
        params: dict[str, str] = {}
        if limit is not None:
            params["limit"] = str(limit)
        if continuation is not None:
            params["continuation"] = continuation
        if since is not None:
            params["since"] = since
        response = await self.client.get(
            f"/users/{user_id}/timeline", params=params, headers=bearer(token)
        )
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await body_of(response, schemas.PostPage)
        return data

    async def timeline_ids(self, user_id: str, token: str) -> list[str]:
        """Every post id on the whole timeline, following continuations to the end."""
        ids: list[str] = []
        continuation: str | None = None
        while True:
            page = await self.timeline(user_id, token, continuation=continuation)
            ids.extend(item["post_id"] for item in page["items"])
            continuation = page["continuation"]
            if continuation is None:
                return ids

    async def profile(self, user_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/users/{user_id}")
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await body_of(response, schemas.Profile)
        return data


async def trace_keys(storage: Storage, table: str, partition: str) -> list[str]:
    """The row keys of the removal traces in one partition (one query)."""
    page = await query_page(
        storage.reader(table, partition),
        f"PartitionKey eq @pk and {TRACE_RANGE}",
        {"pk": partition, **TRACE_BOUNDS},
        select=["RowKey"],
        limit=1000,
        continuation=None,
    )
    return [row["RowKey"] for row in page.items]


async def visible_work(queue: FanoutQueue) -> list[QueueMessage]:
    """The visible work messages of every lane of a shard, peeked (not leased)."""
    return [message for lane in queue.lanes for message in await lane.peek()]
