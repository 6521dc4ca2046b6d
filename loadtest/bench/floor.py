"""The CPU floor of one live delivery's write: a bare aiohttp ``PUT`` of a timeline entity,
signed with the same shared key, no pipeline at all. What the worker spends per delivery
above it is the price of azure-core's pipeline and of our own work."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from loadtest.bench.harness import bounded, timeline_entity
from timeline.model.keys import now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.wire.egt import entity_json, row_keys

Send = Callable[[dict[str, Any]], Awaitable[None]]


async def cpu_ms_per_request(send: Send, label: str, count: int, in_flight: int = 16) -> float:
    """This process's CPU per ``send`` of a fresh timeline entity, ``in_flight`` at a time
    (the storage emulator is another process: not counted)."""
    base = now_ticks()
    entities = [timeline_entity(f"{label}{i % 50:03d}", base + i) for i in range(count)]
    started = time.process_time()
    await bounded((send(entity) for entity in entities), in_flight)
    return 1000 * (time.process_time() - started) / count


def bare_put(storage: Storage, session: aiohttp.ClientSession) -> Send:
    """A ``PUT`` of the entity (an upsert that replaces) built and signed by hand."""
    client: Any = storage.table(TIMELINES, "")
    name, key = client.credential.named_key.name, base64.b64decode(client.credential.named_key.key)
    endpoint = f"{client.scheme}://{client._primary_hostname}"
    prefix = urlsplit(endpoint).path
    version = client.api_version

    async def send(entity: dict[str, Any]) -> None:
        resource = f"/{TIMELINES}({row_keys(entity)})"
        date = formatdate(usegmt=True)
        signed = f"PUT\n\napplication/json\n{date}\n/{name}{prefix}{resource}"
        digest = hmac.new(key, signed.encode(), hashlib.sha256).digest()
        headers = {
            "x-ms-date": date,
            "x-ms-version": version,
            "DataServiceVersion": "3.0",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Authorization": f"SharedKey {name}:{base64.b64encode(digest).decode()}",
        }
        body = entity_json(entity)
        async with session.put(f"{endpoint}{resource}", data=body, headers=headers) as response:
            await response.read()
            if response.status != 204:
                raise RuntimeError(f"bare PUT answered {response.status}")

    return send


async def live_floor(storage: Storage, count: int) -> dict[str, float]:
    """``live_floor_cpu_ms_per_request``: the bare signed ``PUT``'s CPU per request."""
    async with aiohttp.ClientSession() as session:
        send = bare_put(storage, session)
        await cpu_ms_per_request(send, "floor-warm", min(count, 200))
        return {"live_floor_cpu_ms_per_request": await cpu_ms_per_request(send, "floor", count)}
