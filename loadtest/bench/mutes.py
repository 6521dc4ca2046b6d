"""Blocks, mutes and keyword filters on the read path: what a home page spends loading its
reader's relations (``block_check_requests_per_read``), and first-page latency of a reader
with ``MUTES`` mutes (a tenth of its timeline by muted authors, so pages refill) and of one
with ``FILTERS`` filters (a tenth of its timeline holding one of their phrases) beside one
with neither, the same timeline otherwise, read in turn in the same run
(``mute_read_p50_ratio``, ``filter_read_p50_ratio``)."""

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
FILTERS = 100
PAGE = 250
CHECKS = "timeline_relation_checks_total"


async def mutes(sizes: Sizes) -> dict[str, Any]:
    signer = TokenSigner(SECRET.encode(), token_ttl_s=3600)
    plain, muting, filtering = "plainreader", "mutingreader", "filteringreader"
    muted = [f"muted{i:03d}" for i in range(MUTES)]
    async with fresh_storage() as (azurites, storage):
        base = now_ticks() - 3 * PAGE * 10_000_000
        posts = [  # every tenth entry by a muted author: a page refills once
            Post(new_post_id(base + i * 10_000_000), muted[i % MUTES] if i % 10 == 0 else "f", TEXT)
            for i in range(3 * PAGE)
        ]
        copies = [post.to_entity(reader) for reader in (plain, muting) for post in posts]
        copies += [  # the same entries, every tenth holding a filtered word (others: none)
            {
                **post.to_entity(filtering),
                "text": f"{TEXT} word{i % FILTERS:03d}" if i % 10 == 0 else TEXT,
            }
            for i, post in enumerate(posts)
        ]
        await write_rows(storage, TIMELINES, copies, "mutes: seeding timelines")
        since = datetime.now(UTC)
        rows = [{"PartitionKey": muting, "RowKey": f"m-{m}", "since": since} for m in muted]
        rows += [
            {"PartitionKey": filtering, "RowKey": f"f-{new_post_id(base + n)}",
             "phrase": f"WORD{n:03d}", "since": since}
            for n in range(FILTERS)
        ]  # fmt: skip
        await write_rows(storage, RELATIONS, rows, "mutes: seeding mutes and filters")
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
            await first_page(muting)  # warm each
            await first_page(filtering)
            plain_ms: list[float] = []
            muting_ms: list[float] = []
            filtering_ms: list[float] = []
            before = await server.metrics()
            for _ in range(sizes.mute_reads):
                plain_ms.append(await first_page(plain))
                muting_ms.append(await first_page(muting))
            after = await server.metrics()
            for _ in range(sizes.mute_reads):
                filtering_ms.append(await first_page(filtering))
                plain_ms.append(await first_page(plain))
    reads = 2 * sizes.mute_reads
    return {
        "block_check_requests_per_read": delta(before, after, CHECKS) / reads,
        "mute_storage_requests_per_read": delta(before, after, REQUESTS) / reads,
        "mute_read_p50_ms": quantile(muting_ms, 0.5),
        "unmuted_read_p50_ms": quantile(plain_ms, 0.5),
        "mute_read_p50_ratio": quantile(muting_ms, 0.5) / quantile(plain_ms, 0.5),
        "filter_read_p50_ms": quantile(filtering_ms, 0.5),
        "filter_read_p50_ratio": quantile(filtering_ms, 0.5) / quantile(plain_ms, 0.5),
    }
