"""The fan-out work queue shards. Shard ``k`` has two work queues, ``fanout-<k>`` for
user-facing work and ``fanout-<k>-low`` for background work (``timeline.model.priority``), and one
dead-letter queue, ``fanout-<k>-poison``. A message goes to the shard of the user whose
partition it starts from (the author of a post, the follower of a follow), so one user's
messages stay in one shard."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import orjson
from azure.core.exceptions import HttpResponseError
from azure.storage.queue import QueueMessage

from timeline.errors import MalformedMessageError
from timeline.metrics import MESSAGES_SENT
from timeline.model.messages import (
    AccountDeleted,
    FanoutMessage,
    Followed,
    ListDeleted,
    RelationChanged,
    Reposted,
    Unfollowed,
    Unreposted,
    Wake,
    decode,
    encode,
    urgency,
)
from timeline.model.priority import Priority
from timeline.storage.accounts import Storage
from timeline.storage.placement import hash64
from timeline.storage.wire import lean_queue


@dataclass(frozen=True, slots=True)
class PoisonedMessage:
    message_id: str
    """The work message's id when it was parked."""
    reason: str
    content: str
    dequeue_count: int
    poison_id: str = ""
    """Its id in the poison queue: what ``timeline poison drop|requeue ID`` take."""


class MessageSender(Protocol):
    async def send(self, message: FanoutMessage) -> None: ...


@dataclass(frozen=True, slots=True)
class Reservation:
    """A message sent hidden, and what makes it visible: its lane and its pop receipt."""

    lane: Lane
    message: QueueMessage


class Reserving(MessageSender, Protocol):
    """What an API write sends through (``timeline.service.outbox``): its message is
    *reserved* (sent hidden) before the write and *released* (made visible) after it; a
    reservation never released shows up by itself once ``hidden_s`` has passed."""

    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation: ...

    async def release(self, reservation: Reservation) -> None: ...


def shard_key(message: FanoutMessage) -> str:
    match message:
        case Wake():
            return message.reader
        case Reposted() | Unreposted():
            return message.reposter
        case ListDeleted():
            return message.owner
        case AccountDeleted():
            return message.user
        case RelationChanged():
            return message.actor
        case Followed() | Unfollowed():
            return message.follower
        case _:
            return message.author


_STALE_RECEIPT = frozenset({"PopReceiptMismatch", "MessageNotFound"})


class Lane:
    """One work queue of a shard (its user-facing or its background queue), with the
    shard's poison queue: what a worker leases from and settles on."""

    def __init__(self, shard: FanoutQueue, level: Priority) -> None:
        self.shard_queue = shard
        self.shard = shard.shard
        self.level = level
        storage = shard.storage
        self._storage = storage
        self._queue = (
            storage.work_queue(shard.shard)
            if level == Priority.HIGH
            else storage.background_queue(shard.shard)
        )
        self.name: str = self._queue.queue_name
        self._poison = storage.poison_queue(shard.shard)

    async def send_raw(self, content: str, *, visible_in_s: int | None = None) -> QueueMessage:
        """Enqueue with no time-to-live: a backlog must never silently drop a delete."""
        async with self._storage.guard(limited=False):
            return await lean_queue.send_message(
                self._queue, content, time_to_live=-1, visibility_timeout=visible_in_s
            )

    async def release(self, message: QueueMessage) -> None:
        """Make a message sent hidden visible now (its content unchanged). A stale receipt
        (a retry of a release that landed, or the message shown and leased already) is
        fine: the message is visible or taken."""
        try:
            async with self._storage.guard(limited=False):
                await lean_queue.update_message(self._queue, message, visibility_timeout=0)
        except HttpResponseError as error:
            if getattr(error, "error_code", None) not in _STALE_RECEIPT:  # set by the storage SDK
                raise

    async def receive(self, count: int, visibility_timeout_s: int) -> list[QueueMessage]:
        """Lease up to ``count`` (≤ 32) messages for ``visibility_timeout_s`` seconds."""
        async with self._storage.guard(limited=False):
            return await lean_queue.receive_messages(self._queue, count, visibility_timeout_s)

    def moves(self, replacement: FanoutMessage) -> Lane | None:
        """The other lane of this shard, when ``replacement`` belongs there."""
        target = urgency(replacement)
        if target == self.level:
            return None
        return self.shard_queue.lane(target)

    async def extend(self, message: QueueMessage, visibility_timeout_s: int) -> QueueMessage:
        """Renew the lease; the returned message carries the new pop receipt."""
        async with self._storage.guard(limited=False):
            updated = await lean_queue.update_message(
                self._queue, message, visibility_timeout=visibility_timeout_s
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
        async with self._storage.guard(limited=False):
            updated = await lean_queue.update_message(
                self._queue, message, content, visibility_timeout=visibility_timeout_s
            )
        message.pop_receipt = updated.pop_receipt
        message.next_visible_on = updated.next_visible_on
        message.content = content
        return message

    async def rewrite(
        self, message: QueueMessage, replacement: FanoutMessage, visibility_timeout_s: float
    ) -> None:
        """End the lease with ``replacement`` as the message, in place, visible again after
        ``visibility_timeout_s`` (rounded up to whole seconds, as the queue counts). A
        replacement that belongs in the other lane is moved by the worker (``moves``)."""
        delay = math.ceil(visibility_timeout_s)
        async with self._storage.guard(limited=False):
            await lean_queue.update_message(
                self._queue, message, encode(replacement), visibility_timeout=delay
            )

    async def delete(self, message: QueueMessage) -> None:
        async with self._storage.guard(limited=False):
            await lean_queue.delete_message(self._queue, message)

    async def poison(self, message: QueueMessage, reason: str) -> None:
        """Park ``message`` in the shard's poison queue with ``reason``; drop it from this
        lane."""
        record = {
            "reason": reason,
            "content": message.content,
            "dequeue_count": message.dequeue_count,
            "message_id": message.id,
        }
        async with self._storage.guard(limited=False):
            await lean_queue.send_message(
                self._poison, orjson.dumps(record).decode(), time_to_live=-1
            )
        await self.delete(message)

    async def peek(self, count: int = 32) -> list[QueueMessage]:
        async with self._storage.guard(limited=False):
            return list(await self._queue.peek_messages(max_messages=count))

    async def depth(self) -> int:
        """Approximate count of this lane's messages (leased and delayed ones included)."""
        async with self._storage.guard(limited=False):
            properties = await self._queue.get_queue_properties()
        return properties.approximate_message_count or 0


class FanoutQueue:
    """One shard: a queue per priority (``fanout-<k>`` user-facing, ``fanout-<k>-low``
    background) and their poison queue. A message is sent to the lane of its ``urgency``."""

    def __init__(self, storage: Storage, shard: int = 0) -> None:
        self.storage = storage
        self.shard = shard
        self.lanes = [Lane(self, level) for level in Priority]
        self._poison = storage.poison_queue(shard)

    def lane(self, level: Priority) -> Lane:
        return self.lanes[level]

    async def send(self, message: FanoutMessage) -> None:
        await self.lane(urgency(message)).send_raw(encode(message))
        MESSAGES_SENT.labels(message.type).inc()

    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation:
        lane = self.lane(urgency(message))
        sent = await lane.send_raw(encode(message), visible_in_s=hidden_s)
        MESSAGES_SENT.labels(message.type).inc()
        sent.content = None  # a release changes the visibility alone: no body to send again
        return Reservation(lane, sent)

    async def release(self, reservation: Reservation) -> None:
        await reservation.lane.release(reservation.message)

    async def send_raw(
        self, content: str, *, visible_in_s: int | None = None, level: Priority = Priority.HIGH
    ) -> None:
        await self.lane(level).send_raw(content, visible_in_s=visible_in_s)

    async def peek_poison(self, count: int = 32) -> list[PoisonedMessage]:
        async with self.storage.guard(limited=False):
            peeked = await self._poison.peek_messages(max_messages=count)
        return [_parse_poison(message) for message in peeked]

    async def requeue_poison(self, count: int = 32) -> int:
        """Move up to ``count`` poison messages back onto their lane, original content."""
        async with self.storage.guard(limited=False):
            leased = [
                message
                async for message in self._poison.receive_messages(
                    messages_per_page=count, max_messages=count, visibility_timeout=60
                )
            ]
        for message in leased:
            content, level = _fresh(_parse_poison(message).content)
            await self.send_raw(content, level=level)
            async with self.storage.guard(limited=False):
                await self._poison.delete_message(message)
        return len(leased)

    async def depth(self) -> tuple[int, int]:
        """Approximate message counts of the work queues (every lane) and the poison
        queue."""
        work = sum([await lane.depth() for lane in self.lanes])
        return work, await self.poison_depth()

    async def poison_depth(self) -> int:
        async with self.storage.guard(limited=False):
            poison = await self._poison.get_queue_properties()
        return poison.approximate_message_count or 0


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

    async def reserve(self, message: FanoutMessage, hidden_s: int) -> Reservation:
        return await self.shard_for(message).reserve(message, hidden_s)

    async def release(self, reservation: Reservation) -> None:
        await reservation.lane.release(reservation.message)

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


def _fresh(content: str) -> tuple[str, Priority]:
    """The message with its retry bookkeeping reset (a requeued message starts over), and
    the lane it belongs in."""
    try:
        message = decode(content)
    except MalformedMessageError:
        return content, Priority.HIGH
    fresh = message.model_copy(update={"released": 0, "failures": 0, "attempt": 0})
    return encode(fresh), urgency(fresh)


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
        poison_id=str(message.id),
    )
