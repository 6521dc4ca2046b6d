"""One poison message by its id: ``timeline poison drop ID`` and ``timeline poison requeue ID``.

A queue deletes a message only by the receipt of a lease, so the poison queues are leased a
page at a time until the id turns up; the other messages leased on the way are made visible
again at once. Both actions are idempotent: once done, the id is gone, and doing it again
reports that no poison message has it. A requeue sends the message before deleting its
poison copy, so a crash between the two leaves a duplicate, which the worker's idempotent
writes absorb, never a loss."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from timeline.errors import NotFoundError
from timeline.storage.queue import FanoutQueue, FanoutQueues, _fresh, _parse_poison

_PAGE = 32
_LEASE_S = 30
"""How long the messages leased while searching stay hidden if this command dies."""

Action = Callable[[FanoutQueue, QueueClient, QueueMessage], Awaitable[None]]


async def drop_poison(queues: FanoutQueues, poison_id: str) -> str:
    """Delete the poison message ``poison_id``; return its reason."""
    return await _with_poison(queues, poison_id, _drop)


async def requeue_one_poison(queues: FanoutQueues, poison_id: str) -> str:
    """Send the poison message ``poison_id`` back to its work queue with its retry counts
    reset, then delete it from the poison queue; return its reason."""
    return await _with_poison(queues, poison_id, _requeue)


async def _drop(_shard: FanoutQueue, poison: QueueClient, message: QueueMessage) -> None:
    await poison.delete_message(message)


async def _requeue(shard: FanoutQueue, poison: QueueClient, message: QueueMessage) -> None:
    content, level = _fresh(_parse_poison(message).content)
    await shard.send_raw(content, level=level)
    await poison.delete_message(message)


async def _with_poison(queues: FanoutQueues, poison_id: str, action: Action) -> str:
    for shard in queues.shards:
        poison = shard.storage.poison_queue(shard.shard)
        found = await _lease(shard, poison, poison_id)
        if found is not None:
            async with shard.storage.guard(limited=False):
                await action(shard, poison, found)
            return _parse_poison(found).reason
    raise NotFoundError(
        f"no poison message has id {poison_id!r} (`timeline poison list` shows the ids; "
        "a message dropped or requeued is gone)",
        code="poison_message_not_found",
    )


async def _lease(shard: FanoutQueue, poison: QueueClient, poison_id: str) -> QueueMessage | None:
    """Lease pages of ``poison`` until ``poison_id`` turns up; release every other one."""
    passed: list[QueueMessage] = []
    found = None
    try:
        while found is None:
            async with shard.storage.guard(limited=False):
                page = [
                    message
                    async for message in poison.receive_messages(
                        messages_per_page=_PAGE, max_messages=_PAGE, visibility_timeout=_LEASE_S
                    )
                ]
            if not page:
                return None
            for message in page:
                if message.id == poison_id and found is None:
                    found = message
                else:
                    passed.append(message)
        return found
    finally:
        for message in passed:
            async with shard.storage.guard(limited=False):
                await poison.update_message(message, visibility_timeout=0)
