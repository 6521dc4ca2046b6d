"""One queue call each: a receive, a send, an update (lease renewal or rewrite) and a delete
of a message, on the lean path (``timeline.storage.wire.lean_queue``: the queue SDK's requests,
answers and errors without its XML model layer)."""

from __future__ import annotations

from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from timeline.storage.wire import lean_queue


async def receive_messages(
    client: QueueClient, count: int, visibility_timeout: int
) -> list[QueueMessage]:
    """Up to ``count`` (≤ 32) messages leased for ``visibility_timeout`` seconds."""
    return await lean_queue.receive_messages(client, count, visibility_timeout)


async def send_message(
    client: QueueClient,
    content: str,
    *,
    visibility_timeout: int | None = None,
    time_to_live: int | None = None,
) -> QueueMessage:
    """``client.send_message``'s answer: the message enqueued."""
    return await lean_queue.send_message(
        client, content, visibility_timeout=visibility_timeout, time_to_live=time_to_live
    )


async def update_message(
    client: QueueClient,
    message: QueueMessage,
    content: str | None = None,
    *,
    visibility_timeout: int | None = None,
) -> QueueMessage:
    """``client.update_message``'s answer (404 when the pop receipt is stale)."""
    return await lean_queue.update_message(
        client, message, content, visibility_timeout=visibility_timeout
    )


async def delete_message(client: QueueClient, message: QueueMessage) -> None:
    """``client.delete_message``'s answer (404 when the pop receipt is stale)."""
    await lean_queue.delete_message(client, message)
