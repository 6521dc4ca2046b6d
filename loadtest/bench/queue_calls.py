"""What a queue call costs the calling process (a post's send; a worker's receive, lease
renewal and delete; an idle worker's empty receive), through ``timeline.storage.wire.lean_queue``
(the lean path) and through the queue SDK's own calls, timed with ``time.process_time``
(Azurite is another process). 16 calls in flight, as a worker keeps them; receives of 32
messages, the most one request leases.

``python -m loadtest.bench.queue_calls`` runs it alone on a fresh in-memory Azurite and
prints one JSON line; ``make bench`` takes the same keys from its API phase."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from loadtest.bench.harness import BENCH_OPTIONS, bounded
from timeline.storage.clients import Clients
from timeline.storage.wire import lean_queue
from timeline.tools.azurite import Azurite

MESSAGES = 32 * 10
IN_FLIGHT = 16
EMPTY_RECEIVES = 200
CONTENT = (
    '{"type":"post_created","author":"alice-%05d","post_id":"01JD0000000000000000000000",'
    '"created_at":1764000000.123,"attempt":0,"failures":0,"released":0,"text":"héllo 😀"}'
)
"""About the size of a post's fan-out message; unicode, as the project's messages may be."""


@dataclass(frozen=True)
class QueueCalls:
    """A receive, send, update and delete, with the signatures of
    ``timeline.storage.wire.lean_queue``."""

    receive_messages: Callable[[QueueClient, int, int], Awaitable[list[QueueMessage]]]
    send_message: Callable[..., Awaitable[QueueMessage]]
    update_message: Callable[..., Awaitable[QueueMessage]]
    delete_message: Callable[[QueueClient, QueueMessage], Awaitable[None]]


async def _sdk_receive(client: QueueClient, count: int, visibility_timeout: int) -> list[Any]:
    pager = client.receive_messages(
        messages_per_page=count, max_messages=count, visibility_timeout=visibility_timeout
    )
    return [message async for message in pager]


async def _sdk_send(client: QueueClient, content: str, **options: Any) -> QueueMessage:
    return await client.send_message(content, **options)


async def _sdk_update(client: QueueClient, message: QueueMessage, **options: Any) -> QueueMessage:
    return await client.update_message(message, **options)


async def _sdk_delete(client: QueueClient, message: QueueMessage) -> None:
    await client.delete_message(message)


LEAN = QueueCalls(
    lean_queue.receive_messages,
    lean_queue.send_message,
    lean_queue.update_message,
    lean_queue.delete_message,
)
SDK = QueueCalls(_sdk_receive, _sdk_send, _sdk_update, _sdk_delete)
"""The queue SDK's own calls, which the lean ones are measured against."""


async def _cpu_ms(calls: list[Callable[[], Awaitable[object]]], limit: int = IN_FLIGHT) -> float:
    """This process's CPU per call, ``limit`` in flight."""
    started = time.process_time()
    await bounded((call() for call in calls), limit)
    return 1000 * (time.process_time() - started) / len(calls)


async def cpu_ms_per_call(queue: QueueClient, calls: QueueCalls) -> dict[str, float]:
    """One round on a fresh queue through ``calls``: sends, receives of 32, renewals,
    deletes, empty receives."""
    await queue.create_queue()
    leased: list[QueueMessage] = []

    async def receive() -> None:
        leased.extend(await calls.receive_messages(queue, 32, 60))

    async def renew(index: int) -> None:
        message = leased[index]
        leased[index] = await calls.update_message(queue, message, visibility_timeout=60)

    async def send(number: int) -> None:
        await calls.send_message(queue, CONTENT % number, time_to_live=-1)

    # warm the connections up, then measure
    await bounded((calls.receive_messages(queue, 32, 60) for _ in range(IN_FLIGHT)), 16)
    result = {
        "send": await _cpu_ms([lambda n=n: send(n) for n in range(MESSAGES)]),  # type: ignore[misc]
        "receive": await _cpu_ms([receive] * (MESSAGES // 32), limit=4),
    }
    assert len(leased) == MESSAGES, f"received {len(leased)} of {MESSAGES}"
    result["update"] = await _cpu_ms([lambda i=i: renew(i) for i in range(MESSAGES)])  # type: ignore[misc]
    result["delete"] = await _cpu_ms(
        [lambda m=m: calls.delete_message(queue, m) for m in leased]  # type: ignore[misc]
    )
    result["empty_receive"] = await _cpu_ms([receive] * EMPTY_RECEIVES)
    assert len(leased) == MESSAGES, "the queue was not empty"
    await queue.delete_queue()
    return result


async def queue_call_costs(connection_string: str) -> dict[str, float]:
    """Both, twice each, interleaved (the machine's load drifts), each round on fresh
    clients; the lower of each."""
    rounds: dict[str, list[dict[str, float]]] = {"": [], "_sdk": []}
    for _ in range(2):
        for suffix, calls in (("", LEAN), ("_sdk", SDK)):
            clients = Clients([connection_string], BENCH_OPTIONS)
            clients.open()
            try:
                queue = clients.queue_client(0, f"bench-{secrets.token_hex(4)}")
                rounds[suffix].append(await cpu_ms_per_call(queue, calls))
            finally:
                await clients.close()
    return {
        f"queue_{call}_cpu_ms{suffix}": min(r[call] for r in runs)
        for suffix, runs in rounds.items()
        for call in runs[0]
    }


async def _alone() -> dict[str, float]:
    azurite = Azurite(location=None)
    await asyncio.to_thread(azurite.start)
    try:
        return await queue_call_costs(azurite.connection_string)
    finally:
        await asyncio.to_thread(azurite.stop)


if __name__ == "__main__":
    print(json.dumps({k: round(v, 3) for k, v in asyncio.run(_alone()).items()}))
