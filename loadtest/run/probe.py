"""The side-by-side probe: ``python -m loadtest.run.probe``, a process of its own.

It reads the same first pages as Locust's users, two ways, one request at a time:

- **raw**: the storage queries the API makes for that page, straight through
  azure-data-tables (``query_entities(...).by_page()``, no service code), on clients that
  ``timeline.storage.accounts.Storage`` builds with the API's own options (same SDK, same aiohttp
  transport, pool and retry policy). A plain reader's page is one query: the head of its
  ``timelines`` partition (``timeline.reads.home``'s first-page query: the merge rows and the
  newest 250). A merged reader's page is what ``timeline.reads.home`` does once it knows the
  reader's merge list: that head query, one ``posts`` query per merged author and the
  ``subjectFollowing`` check, all at once; the round's time is the slowest of them.
- **api**: ``GET /users/{user}/timeline`` through HTTP (aiohttp), the body read in full,
  as Locust times it.

Its own process and event loop, so neither Locust's gevent loop nor the orchestrator's
scrapes can delay its reads. It warms every user first (one raw and one API read each, so
the API knows each merged reader's list, as it does for Locust's users after their first
read), prints ``ready``, then obeys stdin: ``go`` starts the under-load reads (one every
0.12 s, open loop: see ``under_load``), ``stop`` ends them, ``idle`` runs the sequential
idle rounds; after ``stop`` and after ``idle`` it prints one JSON line of samples
(``[start time, ms]`` by source and reader kind; reads that failed are timed like the
others and listed again under ``raw_failed`` or ``api_failed``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from azure.data.tables.aio import TableClient

from timeline.config import Settings
from timeline.model.entities import POST_SELECT
from timeline.reads.home import MIN_AUTHOR_ROWS
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWING, TIMELINES
from timeline.tables.audience import FIRST_POST_KEY, merge_row_author
from timeline.tables.rows import META

HEAD = "PartitionKey eq @pk and RowKey lt @meta"
"""``timeline.reads.home``'s first-page query of the reader's partition (merge rows and posts)."""
AFTER = "PartitionKey eq @pk and RowKey gt @after and RowKey lt @meta"
"""``timeline.reads.home``'s query of a merged author's ``posts`` partition."""
KEYS_PER_FILTER = 14
"""``FollowsRepository.following_among``: one query per 14 subjects."""

Sample = tuple[float, float]
"""When the read started (``time.time()``, to line up with Locust's log), milliseconds."""


async def query(client: TableClient, text: str, parameters: dict[str, Any], **kw: Any) -> list[Any]:
    """One storage query, every entity of its first page deserialized (as the API does)."""
    pager = client.query_entities(text, parameters=parameters, **kw).by_page()
    try:
        page = await pager.__anext__()
    except StopAsyncIteration:
        return []
    return [entity async for entity in page]


class Reader:
    def __init__(
        self,
        storage: Storage,
        session: aiohttp.ClientSession,
        base: str,
        tokens: dict[str, str],
        *,
        limit: int,
        max_merged: int,
    ) -> None:
        self.storage, self.session, self.base, self.tokens = storage, session, base, tokens
        self.limit, self.max_merged = limit, max_merged
        self.merged: dict[str, tuple[str, ...]] = {}
        """Each reader's merge list, from its warm-up head query (the API's guess)."""

    async def head(self, owner: str) -> list[Any]:
        return await query(
            self.storage.reader(TIMELINES, owner), HEAD, {"pk": owner, "meta": META},
            select=POST_SELECT, results_per_page=self.limit + self.max_merged + 1,
        )  # fmt: skip

    async def warm(self, owner: str) -> None:
        rows = await self.head(owner)
        listed = (merge_row_author(row["RowKey"]) for row in rows)
        self.merged[owner] = tuple(author for author in listed if author is not None)
        await self.api(owner)

    async def raw(self, owner: str) -> None:
        """Within the storage timeout, as the API's ``Storage.guard`` bounds each call."""
        async with asyncio.timeout(self.storage.options.timeout_s):
            await self._raw(owner)

    async def _raw(self, owner: str) -> None:
        authors = self.merged.get(owner, ())
        if not authors:
            await self.head(owner)
            return
        rows = min(self.limit, max(MIN_AUTHOR_ROWS, -(-self.limit // (len(authors) + 1))))
        posts = [self.author_posts(author, rows) for author in authors]
        wanted = sorted(authors)
        checks = [
            self.following(owner, wanted[i : i + KEYS_PER_FILTER])
            for i in range(0, len(wanted), KEYS_PER_FILTER)
        ]
        await asyncio.gather(self.head(owner), *posts, *checks)

    async def author_posts(self, author: str, rows: int) -> list[Any]:
        parameters = {"pk": author, "meta": META, "after": FIRST_POST_KEY}
        return await query(
            self.storage.reader(POSTS, author), AFTER, parameters,
            select=[*POST_SELECT, "void"], results_per_page=rows,
        )  # fmt: skip

    async def following(self, owner: str, subjects: list[str]) -> list[Any]:
        keys = " or ".join(f"RowKey eq @s{i}" for i in range(len(subjects)))
        parameters = {"pk": owner, **{f"s{i}": s for i, s in enumerate(subjects)}}
        return await query(
            self.storage.reader(SUBJECT_FOLLOWING, owner), f"PartitionKey eq @pk and ( {keys} )",
            parameters, select=["RowKey", "active"], results_per_page=1000,
        )  # fmt: skip

    async def api(self, owner: str) -> None:
        url = f"{self.base}/users/{owner}/timeline"
        headers = {"Authorization": f"Bearer {self.tokens[owner]}"}
        async with self.session.get(url, headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"GET {url}: {response.status}")


async def timed(call: Callable[[], Awaitable[None]], failed: list[Sample]) -> Sample:
    """How long ``call`` took; a failure (a 503, a storage timeout) is timed too, as Locust
    times its failures, and also listed in ``failed``."""
    at, started = time.time(), time.perf_counter()
    try:
        await call()
    except Exception as error:
        sys.stderr.write(f"probe: {type(error).__name__}: {error}\n")
        failed.append((at, (time.perf_counter() - started) * 1000))
    return at, (time.perf_counter() - started) * 1000


def empty() -> dict[str, dict[str, list[Sample]]]:
    sources = ("raw", "api", "raw_failed", "api_failed")
    return {source: {"plain": [], "merged": []} for source in sources}


async def read(
    reader: Reader, source: str, kind: str, owner: str, samples: dict[str, dict[str, list[Sample]]]
) -> None:
    call = reader.raw if source == "raw" else reader.api
    sample = await timed(lambda: call(owner), samples[f"{source}_failed"][kind])
    samples[source][kind].append(sample)


async def under_load(
    reader: Reader, pools: dict[str, list[str]], every_s: float, stop: asyncio.Future[str]
) -> dict[str, dict[str, list[Sample]]]:
    """Until ``stop``, one read starts every ``every_s`` whether or not the earlier ones
    have ended (open loop): raw plain, raw merged (three times), then API plain and merged,
    every user drawn at random from its pool. A reader that waited for each answer would
    start one read during a stall of storage, where Locust's 50 users each have one in
    flight: its percentiles would leave the stall out (coordinated omission)."""
    rng, samples = random.Random(2), empty()
    cycle = [("raw", "plain"), ("raw", "merged")] * 3 + [("api", "plain"), ("api", "merged")]
    started, reads = time.monotonic(), set[asyncio.Task[None]]()
    for i, (source, kind) in enumerate(itertools.cycle([(s, k) for s, k in cycle if pools[k]])):
        await asyncio.sleep(max(0.0, started + i * every_s - time.monotonic()))
        if stop.done():
            break
        task = asyncio.create_task(read(reader, source, kind, rng.choice(pools[kind]), samples))
        reads.add(task)
        task.add_done_callback(reads.discard)
    await asyncio.gather(*reads)
    return samples


async def idle(
    reader: Reader, pools: dict[str, list[str]], rounds: int
) -> dict[str, dict[str, list[Sample]]]:
    """``rounds`` of: each kind's next user, raw and API back to back (alternating which
    goes first), one request at a time."""
    samples = empty()
    for i in range(rounds):
        for kind in [kind for kind, pool in pools.items() if pool]:
            owner = pools[kind][i % len(pools[kind])]
            for source in ("raw", "api") if i % 2 == 0 else ("api", "raw"):
                await read(reader, source, kind, owner, samples)
    return samples


async def command() -> str:
    line: str = await asyncio.to_thread(sys.stdin.readline)
    return line.strip()


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main_async(args: argparse.Namespace) -> None:
    settings = Settings()
    tokens: dict[str, str] = json.loads(args.tokens.read_text())
    merged_readers = set(
        json.loads(args.tokens.with_name("hybrid.json").read_text())["merged_readers"]
    )
    rng = random.Random(args.seed)
    plain = sorted(set(tokens) - merged_readers)
    pools = {
        "plain": rng.sample(plain, min(args.pool, len(plain))),
        "merged": rng.sample(sorted(merged_readers), min(args.pool, len(merged_readers))),
    }
    connector = aiohttp.TCPConnector(limit=8)
    async with (
        Storage(settings.connection_string(), settings.storage_options()) as storage,
        aiohttp.ClientSession(connector=connector) as session,
    ):
        reader = Reader(
            storage, session, args.base, tokens,
            limit=settings.page_size, max_merged=settings.max_merged_authors,
        )  # fmt: skip
        for owner in [*pools["plain"], *pools["merged"]]:
            await reader.warm(owner)
        emit("ready")
        while (line := await command()) != "":
            if line == "go":
                stop = asyncio.ensure_future(command())
                emit(json.dumps(await under_load(reader, pools, args.every, stop)))
                if (await stop) != "stop":
                    raise RuntimeError("the probe expected 'stop'")
            elif line == "idle":
                emit(json.dumps(await idle(reader, pools, args.idle_rounds)))
            else:
                raise RuntimeError(f"the probe does not know {line!r}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.run.probe", description=__doc__)
    parser.add_argument("--base", required=True, help="the API's base URL")
    parser.add_argument("--tokens", type=Path, required=True, help="loadtest.seed's tokens.json")
    parser.add_argument("--pool", type=int, default=40, help="users of each kind")
    parser.add_argument("--every", type=float, default=0.12, help="seconds between reads")
    parser.add_argument("--idle-rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
