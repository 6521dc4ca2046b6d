"""Follow storm: 64 clients follow one subject at once through a real API process (a user
going viral). Refusals (goal 0), latency quantiles and storage requests per follow, beside a
raw single-row point write measured on the same Azurite moments before."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import aiohttp
from azure.data.tables import UpdateMode
from tqdm import tqdm

from loadtest.bench.api import REQUESTS, SECRET, api_process
from loadtest.bench.harness import fresh_storage
from loadtest.bench.measure import cpu_seconds, delta, quantile
from loadtest.bench.sizes import Sizes
from timeline.model.entities import User
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.names import USERS
from timeline.tables.users import UsersRepository

CLIENTS = 64
STAR = "star"
CONFLICTS = "timeline_counter_conflicts_total"


async def point_write_ms(storage: Storage, count: int) -> list[float]:
    """Latencies of ``count`` upserts of one row, one at a time: the floor of any write."""
    client = storage.table(USERS, STAR)
    latencies = []
    for i in range(count):
        started = time.monotonic()
        await client.upsert_entity(
            {"PartitionKey": STAR, "RowKey": "~probe", "n": i}, mode=UpdateMode.REPLACE
        )
        latencies.append(1000 * (time.monotonic() - started))
    return latencies


async def storm(base: str, follows: int) -> tuple[list[float], int]:
    """``CLIENTS`` clients, each following ``STAR`` as the next of ``follows`` distinct users;
    every accepted follow's latency in ms, and how many were refused."""
    signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
    pending = iter(range(follows))
    latencies: list[float] = []
    refused = 0
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        with tqdm(total=follows, desc="follow_storm: following", leave=False) as bar:

            async def client() -> None:
                nonlocal refused
                for i in pending:  # shared: each follower is taken by one client
                    fan = f"fan{i:06d}"
                    headers = {"Authorization": f"Bearer {signer.mint_bearer(fan)}"}
                    started = time.monotonic()
                    url = f"{base}/users/{fan}/following/{STAR}"
                    async with session.put(url, headers=headers) as response:
                        if response.status == 204:
                            latencies.append(1000 * (time.monotonic() - started))
                        else:
                            refused += 1
                    bar.update()

            await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return latencies, refused


async def followers_of(base: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/users/{STAR}") as got:
        return int((await got.json())["followers"])


async def follow_storm(sizes: Sizes) -> dict[str, float]:
    follows = sizes.follow_storm_follows
    async with fresh_storage() as (azurites, storage):
        await UsersRepository(storage).create(User(STAR, STAR, datetime.now(UTC)))
        point = await point_write_ms(storage, sizes.follow_storm_point_writes)
        async with api_process(azurites) as server:
            before, cpu_before = await server.metrics(), cpu_seconds(server.process.pid)
            latencies, refused = await storm(server.base, follows)
            after, cpu_after = await server.metrics(), cpu_seconds(server.process.pid)
            counted = await followers_of(server.base)
    return {
        "follow_storm_follows": follows,
        "follow_storm_refused": refused,
        "follow_storm_counted_exactly": counted == follows - refused,
        "follow_storm_p50_ms": quantile(latencies, 0.5),
        "follow_storm_p99_ms": quantile(latencies, 0.99),
        "follow_storm_storage_requests_per_follow": delta(before, after, REQUESTS) / follows,
        "follow_storm_counter_conflicts_per_follow": delta(before, after, CONFLICTS) / follows,
        "follow_storm_api_cpu_ms_per_follow": 1000 * (cpu_after - cpu_before) / follows,
        "follow_storm_point_write_p50_ms": quantile(point, 0.5),
        "follow_storm_point_write_p99_ms": quantile(point, 0.99),
    }
