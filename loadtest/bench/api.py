"""The API process's cost per request: CPU and storage calls per home-timeline read (a full
page of 250) and per post, with the default rate limits on. ``docs/capacity.md`` sizes the
API processes from these."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

from loadtest.bench.harness import (
    bounded,
    fresh_storage,
    scrubbed_env,
    timeline_entity,
    write_rows,
)
from loadtest.bench.measure import cpu_seconds, delta, profiled, scrape
from loadtest.bench.queue_calls import queue_call_costs
from loadtest.bench.read_steps import read_steps
from loadtest.bench.single_calls import single_calls
from loadtest.bench.sizes import Sizes
from loadtest.bench.write_calls import write_calls
from timeline.model.keys import now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.names import TIMELINES
from timeline.tools.azurite import Azurite, free_ports

SECRET = "bench-api-secret"  # noqa: S105 - signs the bench's own tokens, for this run only
PAGE = 250
REQUESTS = "timeline_storage_requests_total"


class ApiProcess:
    """A real ``timeline-api`` process on a free port."""

    def __init__(self, azurites: list[Azurite], **settings: str) -> None:
        (port,) = free_ports(1)
        self.base = f"http://127.0.0.1:{port}"
        env = scrubbed_env(
            TIMELINE_STORAGE_CONNECTION_STRINGS="\n".join(a.connection_string for a in azurites),
            TIMELINE_PORT=str(port),
            TIMELINE_AUTH_SECRET=SECRET,
            TIMELINE_DATA_DIR=tempfile.mkdtemp(prefix="bench-api-"),
            **settings,
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api"], env=env, stderr=subprocess.DEVNULL
        )
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=32), raise_for_status=True
        )

    async def ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with self.session.get(f"{self.base}/readyz"):
                    return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the API did not start")
            await asyncio.sleep(0.1)

    async def metrics(self) -> dict[str, float]:
        return await scrape(self.session, f"{self.base}/metrics")

    async def stop(self) -> None:
        await self.session.close()
        self.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.process.wait, 30)


@contextlib.asynccontextmanager
async def api_process(azurites: list[Azurite], **settings: str) -> AsyncIterator[ApiProcess]:
    process = ApiProcess(azurites, **settings)
    try:
        await process.ready()
        yield process
    finally:
        await process.stop()


async def cost(
    server: ApiProcess,
    calls: Sequence[Callable[[], Awaitable[Any]]],
    label: str,
    profile: Path | None = None,
) -> tuple[float, float]:
    """CPU ms of the API process and storage requests it made, per call."""
    before, cpu_before = await server.metrics(), cpu_seconds(server.process.pid)
    with (
        profiled([server.process.pid], profile, label.replace("api: ", "api-").replace(" ", "-")),
        tqdm(total=len(calls), desc=label, leave=False) as bar,
    ):
        await bounded((call() for call in calls), 16, bar)
    after, cpu_after = await server.metrics(), cpu_seconds(server.process.pid)
    return 1000 * (cpu_after - cpu_before) / len(calls), delta(before, after, REQUESTS) / len(calls)


async def api(sizes: Sizes, profile: Path | None = None) -> dict[str, float]:
    signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
    owners = [f"reader{i:04d}" for i in range(sizes.api_users)]
    tokens = {owner: {"Authorization": f"Bearer {signer.mint_bearer(owner)}"} for owner in owners}
    async with fresh_storage() as (azurites, storage):
        base = now_ticks()
        rows = [timeline_entity(owner, base + i) for owner in owners for i in range(PAGE)]
        await write_rows(storage, TIMELINES, rows, "api: seeding timelines")
        async with api_process(azurites) as server:

            async def read(owner: str) -> None:
                url = f"{server.base}/users/{owner}/timeline"
                async with server.session.get(url, headers=tokens[owner]) as response:
                    assert len((await response.json())["items"]) == PAGE

            async def post(owner: str) -> None:
                url = f"{server.base}/users/{owner}/posts"
                body = {"text": "x" * 120}
                async with server.session.post(url, json=body, headers=tokens[owner]):
                    pass

            n = len(owners)
            reads = [partial(read, owners[i % n]) for i in range(sizes.api_requests)]
            posts = [partial(post, owners[i % n]) for i in range(sizes.api_requests // 2)]
            await cost(server, reads[: len(reads) // 10], "api: warming up")
            read_ms, read_requests = await cost(server, reads, "api: timeline reads", profile)
            post_ms, post_requests = await cost(server, posts, "api: posts", profile)
        bearer = tokens[owners[0]]["Authorization"].removeprefix("Bearer ")
        steps = await read_steps(storage, owners[0], bearer, signer)
        steps |= await single_calls(storage)
        steps |= await write_calls(storage)
        steps |= await queue_call_costs(azurites[0].connection_string)
    return steps | {
        "api_cpu_ms_per_read": read_ms,
        "api_storage_requests_per_read": read_requests,
        "api_cpu_ms_per_post": post_ms,
        "api_storage_requests_per_post": post_requests,
    }
