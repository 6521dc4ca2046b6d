"""What a home-timeline read costs at each step, timed in the bench's own process: each step
run many times over and its CPU time (``time.process_time``: Azurite is another process)
divided by the runs. The API's figure (``api_cpu_ms_per_read``) minus their sum is roughly
what the HTTP server (aiohttp's parsing, routing, middlewares, the response's write) adds:
a difference of two noisy measurements, so no key of its own. The page's query alone is also
timed through the table SDK's own pager, on the same client, for the lean path's saving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from azure.data.tables.aio import TableClient

from timeline.model.entities import POST_SELECT, Page
from timeline.model.tokens import TokenSigner
from timeline.reads.home import HomeTimeline, Position
from timeline.service.paging import Pager
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.names import TIMELINES
from timeline.storage.wire import lean

PAGE = 250
QUERY = "PartitionKey eq @pk"
LOCAL_RUNS = 2000
"""Runs of a step that never leaves the process (a few µs to a ms each)."""
STORAGE_RUNS = 320
"""Runs of a step that makes one storage request."""
IN_FLIGHT = 16
"""Storage steps at once: as many as the bench's API phase keeps in flight."""


def _cpu_ms(step: Callable[[], object], runs: int = LOCAL_RUNS) -> float:
    started = time.process_time()
    for _ in range(runs):
        step()
    return 1000 * (time.process_time() - started) / runs


async def _cpu_ms_async(step: Callable[[], Awaitable[object]], runs: int = STORAGE_RUNS) -> float:
    """CPU of this process per run, ``IN_FLIGHT`` at a time as the API serves them (one at
    a time, each run would pay the event loop's wake-ups alone); the waits for Azurite cost
    it nothing."""
    await asyncio.gather(*(step() for _ in range(IN_FLIGHT)))  # connections opened
    started = time.process_time()
    for _ in range(runs // IN_FLIGHT):
        await asyncio.gather(*(step() for _ in range(IN_FLIGHT)))
    return 1000 * (time.process_time() - started) / (runs // IN_FLIGHT * IN_FLIGHT)


async def sdk_page(client: TableClient, owner: str) -> list[Any]:
    """The page's query through the SDK's own pager: its first page of entities."""
    entities: Any = client.query_entities(
        QUERY, parameters={"pk": owner}, select=POST_SELECT, results_per_page=PAGE
    )
    page = await entities.by_page().__anext__()
    return [entity async for entity in page]


async def read_steps(
    storage: Storage, owner: str, bearer: str, signer: TokenSigner
) -> dict[str, float]:
    """Per step of one 250-item first page of ``owner`` (its partition holds 250 posts):
    the bearer check, the storage query with the page's merge, the response's items and
    tokens, its encoding, and the floor: decoding the query's body alone. And the query
    alone, as a home read makes it (``calls.query_rows``) and through the SDK's pager."""
    home = HomeTimeline(storage, max_merged=20)
    rows, _ = await home.rows(owner, PAGE, Position())
    assert len(rows) == PAGE, len(rows)
    client = storage.reader(TIMELINES, owner)
    response = await lean.query_response(
        client, QUERY, {"pk": owner}, select=POST_SELECT, limit=PAGE, continuation=None
    )
    body = response.content
    assert len(orjson.loads(body)["value"]) == PAGE
    scope, pager = f"timeline:{owner}", Pager(signer, PAGE)
    token = {"a": rows[-1]["RowKey"], "m": "", "n": str(PAGE)}
    out = pager.rows_out(scope, Page(rows, token))
    response_body = {"items": out.items, "continuation": out.continuation, "newest": out.newest}
    return {
        "read_floor_cpu_ms": _cpu_ms(lambda: orjson.loads(body)),
        "read_floor_body_bytes": float(len(body)),
        "read_step_auth_ms": _cpu_ms(lambda: signer.verify(bearer)),
        "read_step_storage_ms": await _cpu_ms_async(lambda: home.rows(owner, PAGE, Position())),
        "read_query_cpu_ms": await _cpu_ms_async(
            lambda: calls.query_rows(
                client, QUERY, {"pk": owner}, select=POST_SELECT, limit=PAGE, continuation=None
            )
        ),
        "read_query_cpu_ms_sdk": await _cpu_ms_async(lambda: sdk_page(client, owner)),
        "read_step_shape_ms": _cpu_ms(lambda: pager.rows_out(scope, Page(rows, token))),
        "read_step_encode_ms": _cpu_ms(lambda: orjson.dumps(response_body)),
        "read_response_bytes": float(len(orjson.dumps(response_body))),
    }
