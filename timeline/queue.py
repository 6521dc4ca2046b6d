"""The fan-out work queue shards ``fanout-<k>``, each with a ``fanout-<k>-poison`` dead-letter
queue. A message goes to the shard of the user whose partition it starts from (the author of
a post, the follower of a follow), so one user's messages stay in one shard."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import orjson
from azure.storage.queue import QueueMessage

from timeline.errors import MalformedMessageError
from timeline.messages import FanoutMessage, Followed, Unfollowed, decode, encode
from timeline.metrics import MESSAGES_SENT
from timeline.placement import hash64
from timeline.storage import Storage


@dataclass(frozen=True, slots=True)
class PoisonedMessage:
    message_id: str
    reason: str
    content: str
    dequeue_count: int


class MessageSender(Protocol):
    async def send(self, message: FanoutMessage) -> None: ...


def shard_key(message: FanoutMessage) -> str:
    return message.follower if isinstance(message, Followed | Unfollowed) else message.author


class FanoutQueue:
    """One shard: its work queue and its poison queue."""

    def __init__(self, storage: Storage, shard: int = 0) -> None:
        self._storage = storage
        self.shard = shard
        self._queue = storage.work_queue(shard)
        self._poison = storage.poison_queue(shard)

    async def send(self, message: FanoutMessage) -> None:
        await self.send_raw(encode(message))
        MESSAGES_SENT.labels(message.type).inc()

    async def send_raw(self, content: str, *, visible_in_s: int | None = None) -> None:
        """Enqueue with no time-to-live: a backlog must never silently drop a delete."""
        async with self._storage.guard():
            await self._queue.send_message(
                content, time_to_live=-1, visibility_timeout=visible_in_s
            )

    async def receive(self, count: int, visibility_timeout_s: int) -> list[QueueMessage]:
        """Lease up to ``count`` (≤ 32) messages for ``visibility_timeout_s`` seconds."""
        async with self._storage.guard():
            pager = self._queue.receive_messages(
                messages_per_page=count, max_messages=count, visibility_timeout=visibility_timeout_s
            )
            return [message async for message in pager]

    async def extend(self, message: QueueMessage, visibility_timeout_s: int) -> QueueMessage:
        """Renew the lease; the returned message carries the new pop receipt."""
        async with self._storage.guard():
            updated = await self._queue.update_message(
                message, visibility_timeout=visibility_timeout_s
            )
        message.pop_receipt = updated.pop_receipt
        message.next_visible_on = updated.next_visible_on
        return message

    async def mark(
        self, message: QueueMessage, replacement: FanoutMessage, visibility_timeout_s: int
    ) -> QueueMessage:
        """Replace the content and keep the lease (renewed); the returned message carries
        the new pop receipt."""
        content = encode(replacement)
        async with self._storage.guard():
            updated = await self._queue.update_message(
                message, content=content, visibility_timeout=visibility_timeout_s
            )
        message.pop_receipt = updated.pop_receipt
        message.next_visible_on = updated.next_visible_on
        message.content = content
        return message

    async def rewrite(
        self, message: QueueMessage, replacement: FanoutMessage, visibility_timeout_s: float
    ) -> None:
        """End the lease by replacing the message's content in place; it is visible again
        after ``visibility_timeout_s`` (rounded up to whole seconds, as the queue counts)."""
        async with self._storage.guard():
            await self._queue.update_message(
                message,
                content=encode(replacement),
                visibility_timeout=math.ceil(visibility_timeout_s),
            )

    async def delete(self, message: QueueMessage) -> None:
        async with self._storage.guard():
            await self._queue.delete_message(message)

    async def poison(self, message: QueueMessage, reason: str) -> None:
        """Park ``message`` in ``fanout-poison`` with ``reason``; drop it from the work queue."""
        record = {
            "reason": reason,
            "content": message.content,
            "dequeue_count": message.dequeue_count,
            "message_id": message.id,
        }
        async with self._storage.guard():
            await self._poison.send_message(orjson.dumps(record).decode(), time_to_live=-1)
        await self.delete(message)

    async def peek_work(self, count: int = 32) -> list[QueueMessage]:
        """Visible work messages, without leasing them."""
        async with self._storage.guard():
            return list(await self._queue.peek_messages(max_messages=count))

    async def peek_poison(self, count: int = 32) -> list[PoisonedMessage]:
        async with self._storage.guard():
            peeked = await self._poison.peek_messages(max_messages=count)
        return [_parse_poison(message) for message in peeked]

    async def requeue_poison(self, count: int = 32) -> int:
        """Move up to ``count`` poison messages back onto the work queue, original content."""
        async with self._storage.guard():
            leased = [
                message
                async for message in self._poison.receive_messages(
                    messages_per_page=count, max_messages=count, visibility_timeout=60
                )
            ]
        for message in leased:
            await self.send_raw(_fresh(_parse_poison(message).content))
            async with self._storage.guard():
                await self._poison.delete_message(message)
        return len(leased)

    async def depth(self) -> tuple[int, int]:
        """Approximate message counts of the work queue and the poison queue."""
        async with self._storage.guard():
            work = await self._queue.get_queue_properties()
            poison = await self._poison.get_queue_properties()
        return work.approximate_message_count or 0, poison.approximate_message_count or 0


class FanoutQueues:
    """Every shard: sends each message to its key's shard; admin views see all shards.

    The shards are known once the placement has been read, which may be after start."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._shards: list[FanoutQueue] = []

    @property
    def shards(self) -> list[FanoutQueue]:
        if not self._shards:
            self._shards = [
                FanoutQueue(self._storage, shard) for shard in range(self._storage.queue_shards)
            ]
        return self._shards

    def shard_for(self, message: FanoutMessage) -> FanoutQueue:
        return self.shard_for_key(shard_key(message))

    def shard_for_key(self, key: str) -> FanoutQueue:
        return self.shards[hash64(key) % len(self.shards)]

    async def send(self, message: FanoutMessage) -> None:
        await self.shard_for(message).send(message)

    async def depth(self) -> tuple[int, int]:
        """Work and poison messages summed over the shards."""
        depths = [await shard.depth() for shard in self.shards]
        return sum(work for work, _ in depths), sum(poison for _, poison in depths)

    async def peek_poison(self, count: int = 32) -> list[PoisonedMessage]:
        found: list[PoisonedMessage] = []
        for shard in self.shards:
            found += await shard.peek_poison(count - len(found)) if len(found) < count else []
        return found

    async def requeue_poison(self, count: int = 32) -> int:
        moved = 0
        for shard in self.shards:
            if moved < count:
                moved += await shard.requeue_poison(count - moved)
        return moved


def _fresh(content: str) -> str:
    """The message with its retry bookkeeping reset: a requeued message starts over."""
    try:
        message = decode(content)
    except MalformedMessageError:
        return content
    return encode(message.model_copy(update={"released": 0, "failures": 0, "attempt": 0}))


def _parse_poison(message: QueueMessage) -> PoisonedMessage:
    try:
        record = orjson.loads(message.content)
    except orjson.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        record = {"reason": "unknown", "content": message.content}
    return PoisonedMessage(
        message_id=str(record.get("message_id", message.id)),
        reason=str(record.get("reason", "")),
        content=str(record.get("content", "")),
        dequeue_count=int(record.get("dequeue_count", 0)),
    )
