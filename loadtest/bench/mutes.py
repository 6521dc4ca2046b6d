"""Blocks and mutes on the read path: what a home page spends loading its reader's relations
(``block_check_requests_per_read``), and first-page latency of a reader with ``MUTES`` mutes
(a tenth of its timeline by muted authors, so pages refill) beside one with none, the same
timeline otherwise, read alternately in the same run (``mute_read_p50_ratio``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from loadtest.bench.api import REQUESTS, SECRET, api_process
from loadtest.bench.harness import TEXT, fresh_storage, write_rows
from loadtest.bench.measure import delta, quantile
from loadtest.bench.sizes import Sizes
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.names import RELATIONS, TIMELINES

MUTES = 100
PAGE = 250
CHECKS = "timeline_relation_checks_total"


async def mutes(sizes: Sizes) -> dict[str, Any]:
    signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
    plain, muting = "plainreader", "mutingreader"
    muted = [f"muted{i:03d}" for i in range(MUTES)]
    async with fresh_storage() as (azurites, storage):
        base = now_ticks() - 3 * PAGE * 10_000_000
        posts = [  # every tenth entry by a muted author: a page refills once
            Post(new_post_id(base + i * 10_000_000), muted[i % MUTES] if i % 10 == 0 else "f", TEXT)
            for i in range(3 * PAGE)
        ]
        copies = [post.to_entity(reader) for reader in (plain, muting) for post in posts]
        await write_rows(storage, TIMELINES, copies, "mutes: seeding timelines")
        since = datetime.now(UTC)
        rows = [{"PartitionKey": muting, "RowKey": f"m-{m}", "since": since} for m in muted]
        await write_rows(storage, RELATIONS, rows, "mutes: seeding mutes")
        async with api_process(azurites) as server:

            async def first_page(user: str) -> float:
                headers = {"Authorization": f"Bearer {signer.mint_bearer(user)}"}
                started = time.perf_counter()
                url = f"{server.base}/users/{user}/timeline"
                async with server.session.get(url, headers=headers) as response:
                    items = (await response.json())["items"]
                assert len(items) == PAGE, len(items)
                return 1000 * (time.perf_counter() - started)

            await first_page(plain)
            await first_page(muting)  # warm both
            plain_ms: list[float] = []
            muting_ms: list[float] = []
            before = await server.metrics()
            for _ in range(sizes.mute_reads):
                plain_ms.append(await first_page(plain))
                muting_ms.append(await first_page(muting))
            after = await server.metrics()
    reads = 2 * sizes.mute_reads
    return {
        "block_check_requests_per_read": delta(before, after, CHECKS) / reads,
        "mute_storage_requests_per_read": delta(before, after, REQUESTS) / reads,
        "mute_read_p50_ms": quantile(muting_ms, 0.5),
        "unmuted_read_p50_ms": quantile(plain_ms, 0.5),
        "mute_read_p50_ratio": quantile(muting_ms, 0.5) / quantile(plain_ms, 0.5),
    }
