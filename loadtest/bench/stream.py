"""Live streams: what an open ``/timeline/stream`` costs in storage requests per connected
client per minute (read from the API's own counter while nothing else runs), for a plain
reader and for one that merges large authors, and how long an entry takes from landing in
storage to reaching a streaming client."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from loadtest.bench.api import REQUESTS, SECRET, ApiProcess, api_process
from loadtest.bench.harness import TEXT, fresh_storage
from loadtest.bench.hybrid import MERGED_AUTHORS, _seed_reads
from loadtest.bench.measure import delta, quantile
from loadtest.bench.sizes import Sizes
from loadtest.bench.stream_polls import poll_requests
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.calls import submit_batch
from timeline.storage.names import TIMELINES
from timeline.tables.audience import AudienceRepository

POLL_S = 2.0
"""The default ``TIMELINE_STREAM_POLL_S``, set explicitly so the figure names its cause."""


async def stream(sizes: Sizes) -> dict[str, Any]:
    signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
    plain, merged = "plainreader", "mergedreader"
    larges = [f"large{i}" for i in range(MERGED_AUTHORS)]
    async with fresh_storage() as (azurites, storage):
        await _seed_reads(storage, AudienceRepository(storage), larges, plain, merged)
        # the clients share a reader: what a stream costs does not depend on whose it is
        streams_per_user = str(sizes.stream_clients)
        async with api_process(
            azurites,
            TIMELINE_STREAM_POLL_S=str(POLL_S),
            TIMELINE_MAX_STREAMS_PER_USER=streams_per_user,
        ) as server:
            costs = {
                reader: await _requests_per_client_minute(server, signer, reader, sizes)
                for reader in (plain, merged)
            }
            latencies = await _event_latencies(server, signer, plain, storage, sizes)
        polls = await poll_requests([azurite.connection_string for azurite in azurites])
    return {
        **polls,
        "stream_clients": sizes.stream_clients,
        "stream_poll_s": POLL_S,
        "stream_requests_per_client_minute": costs[plain],
        f"stream_requests_per_client_minute_merging_{MERGED_AUTHORS}": costs[merged],
        "stream_event_latency_p50_ms": 1000 * quantile(latencies, 0.5),
        "stream_event_latency_p99_ms": 1000 * quantile(latencies, 0.99),
    }


@contextlib.asynccontextmanager
async def _open_streams(
    server: ApiProcess, signer: TokenSigner, reader: str, count: int
) -> AsyncIterator[list[aiohttp.ClientResponse]]:
    headers = {"Authorization": f"Bearer {signer.mint_bearer(reader)}"}
    url = f"{server.base}/users/{reader}/timeline/stream"
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        responses = [await session.get(url, headers=headers) for _ in range(count)]
        refused = [response.status for response in responses if response.status != 200]
        if refused:
            raise RuntimeError(f"streams refused: {refused}")
        try:
            yield responses
        finally:
            for response in responses:
                response.close()


async def _requests_per_client_minute(
    server: ApiProcess, signer: TokenSigner, reader: str, sizes: Sizes
) -> float:
    """Storage requests the API makes per open stream per minute, the streams idle."""
    async with _open_streams(server, signer, reader, sizes.stream_clients):
        await asyncio.sleep(2 * POLL_S)  # past the set-up reads of every stream
        before, started = await server.metrics(), time.monotonic()
        await asyncio.sleep(sizes.stream_seconds)
        after, elapsed = await server.metrics(), time.monotonic() - started
    return delta(before, after, REQUESTS) / sizes.stream_clients / (elapsed / 60)


async def _event_latencies(
    server: ApiProcess,
    signer: TokenSigner,
    reader: str,
    storage: Storage,
    sizes: Sizes,
) -> list[float]:
    """Seconds from an entry's write to storage until a stream sends it; writes come at
    random moments of the poll cycle, as real ones do."""
    async with _open_streams(server, signer, reader, 1) as (response,):
        await asyncio.sleep(2 * POLL_S)
        latencies: list[float] = []
        for _ in range(sizes.stream_events):
            await asyncio.sleep(random.uniform(0, POLL_S))
            post = Post(new_post_id(now_ticks()), "friend", TEXT)
            await submit_batch(storage, TIMELINES, reader, [("upsert", post.to_entity(reader))])
            written = time.monotonic()
            while post.post_id.encode() not in await response.content.readline():
                pass
            latencies.append(time.monotonic() - written)
    return latencies
