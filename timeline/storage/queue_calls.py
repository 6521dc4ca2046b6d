"""One queue call each: a receive, a send, an update (lease renewal or rewrite) and a delete
of a message, on the lean path (``timeline.storage.lean_queue``) for ``Storage``'s own queue
clients when the switch is on, else the queue SDK's own calls."""

from __future__ import annotations

from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from timeline.storage import lean_queue
from timeline.storage.clients import RoutedQueueClient


async def receive_messages(
    client: QueueClient, count: int, visibility_timeout: int
) -> list[QueueMessage]:
    """Up to ``count`` (≤ 32) messages leased for ``visibility_timeout`` seconds."""
    if _lean(client):
        return await lean_queue.receive_messages(client, count, visibility_timeout)
    pager = client.receive_messages(
        messages_per_page=count, max_messages=count, visibility_timeout=visibility_timeout
    )
    return [message async for message in pager]


async def send_message(
    client: QueueClient,
    content: str,
    *,
    visibility_timeout: int | None = None,
    time_to_live: int | None = None,
) -> QueueMessage:
    """``client.send_message``, lean when it can."""
    if _lean(client):
        return await lean_queue.send_message(
            client, content, visibility_timeout=visibility_timeout, time_to_live=time_to_live
        )
    return await client.send_message(
        content, visibility_timeout=visibility_timeout, time_to_live=time_to_live
    )


async def update_message(
    client: QueueClient,
    message: QueueMessage,
    content: str | None = None,
    *,
    visibility_timeout: int | None = None,
) -> QueueMessage:
    """``client.update_message`` (404 when the pop receipt is stale), lean when it can."""
    if _lean(client):
        return await lean_queue.update_message(
            client, message, content, visibility_timeout=visibility_timeout
        )
    return await client.update_message(
        message, content=content, visibility_timeout=visibility_timeout
    )


async def delete_message(client: QueueClient, message: QueueMessage) -> None:
    """``client.delete_message`` (404 when the pop receipt is stale), lean when it can."""
    if _lean(client):
        await lean_queue.delete_message(client, message)
    else:
        await client.delete_message(message)


def _lean(client: QueueClient) -> bool:
    """Whether this client takes the lean path (a wrapped or foreign client never does)."""
    return isinstance(client, RoutedQueueClient) and client.lean and lean_queue.usable(client)
