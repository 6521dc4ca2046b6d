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

Besides Locust's two kinds of readers (``plain``, ``merged``) it reads a third, ``full``:
the seed's full-page readers (``full000``..., left out of Locust), whose first page holds
the whole 250 posts. Their raw read is one query of 250 rows with the API's ``$select``,
through the API's own query call (``timeline.storage.calls.query_page``, so the lean path
as the API has it). The reads live in ``loadtest.run.reader``.

Its own process and event loop, so neither Locust's gevent loop nor the orchestrator's
scrapes can delay its reads. It warms every user first (one raw and one API read each, so
the API knows each merged reader's list, as it does for Locust's users after their first
read; a full-page reader's two must both hold 250 posts), prints ``ready``, then obeys
stdin: ``go`` starts the under-load reads (one every 0.12 s, open loop: see
``under_load``), ``stop`` ends them, ``idle`` runs the sequential idle rounds; after
``stop`` and after ``idle`` it prints one JSON line of samples
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

import aiohttp

from loadtest.run.reader import Reader
from timeline.config import Settings
from timeline.storage.accounts import Storage

Sample = tuple[float, float]
"""When the read started (``time.time()``, to line up with Locust's log), milliseconds."""
KINDS = ("plain", "merged", "full")


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
    return {source: {kind: [] for kind in KINDS} for source in sources}


async def read(
    reader: Reader, source: str, kind: str, owner: str, samples: dict[str, dict[str, list[Sample]]]
) -> None:
    call = reader.api if source == "api" else reader.full if kind == "full" else reader.raw
    sample = await timed(lambda: call(owner), samples[f"{source}_failed"][kind])
    samples[source][kind].append(sample)


async def under_load(
    reader: Reader, pools: dict[str, list[str]], every_s: float, stop: asyncio.Future[str]
) -> dict[str, dict[str, list[Sample]]]:
    """Until ``stop``, one read starts every ``every_s`` whether or not the earlier ones
    have ended (open loop): raw plain, raw merged (three times), API plain and merged, then
    raw full and API full, every user drawn at random from its pool. A reader that waited
    for each answer would start one read during a stall of storage, where Locust's 50 users
    each have one in flight: its percentiles would leave the stall out (coordinated omission)."""
    rng, samples = random.Random(2), empty()
    cycle = [("raw", "plain"), ("raw", "merged")] * 3 + [("api", "plain"), ("api", "merged")]
    cycle += [("raw", "full"), ("api", "full")]
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
    reader: Reader, pools: dict[str, list[str]], rounds: dict[str, int]
) -> dict[str, dict[str, list[Sample]]]:
    """``rounds[kind]`` rounds of each kind in turn: its next user, raw and API back to back
    (alternating which goes first), one request at a time."""
    samples = empty()
    for i in range(max(rounds.values())):
        for kind in [kind for kind, pool in pools.items() if pool and i < rounds[kind]]:
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
    hybrid: dict[str, list[str]] = json.loads(args.tokens.with_name("hybrid.json").read_text())
    merged_readers = set(hybrid["merged_readers"])
    rng = random.Random(args.seed)
    plain = sorted(set(tokens) - merged_readers - set(hybrid.get("full_readers", [])))
    pools = {
        "plain": rng.sample(plain, min(args.pool, len(plain))),
        "merged": rng.sample(sorted(merged_readers), min(args.pool, len(merged_readers))),
        "full": hybrid.get("full_readers", []),
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
        for owner in pools["full"]:
            await reader.warm_full(owner)
        emit("ready")
        while (line := await command()) != "":
            if line == "go":
                stop = asyncio.ensure_future(command())
                emit(json.dumps(await under_load(reader, pools, args.every, stop)))
                if (await stop) != "stop":
                    raise RuntimeError("the probe expected 'stop'")
            elif line == "idle":
                rounds = {"plain": args.idle_rounds, "merged": args.idle_rounds}
                emit(json.dumps(await idle(reader, pools, rounds | {"full": args.idle_full})))
            else:
                raise RuntimeError(f"the probe does not know {line!r}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.run.probe", description=__doc__)
    parser.add_argument("--base", required=True, help="the API's base URL")
    parser.add_argument("--tokens", type=Path, required=True, help="loadtest.seed's tokens.json")
    parser.add_argument("--pool", type=int, default=40, help="users of each kind")
    parser.add_argument("--every", type=float, default=0.12, help="seconds between reads")
    parser.add_argument("--idle-rounds", type=int, default=100)
    parser.add_argument(
        "--idle-full", type=int, default=300, help="idle rounds of full pages (raw and API each)"
    )
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
