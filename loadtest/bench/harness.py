"""What every phase shares: fresh Azurites and worker processes, the worker's Prometheus
endpoint, CPU time, polling, quantiles and seeding helpers. ``loadtest.run`` and
``loadtest.seed`` use it too."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from tqdm import tqdm

from loadtest.bench.measure import cpu_seconds, scrape
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostCreated, encode
from timeline.storage.accounts import Storage, StorageOptions
from timeline.storage.calls import Operation, chunked, submit_batch
from timeline.storage.names import POSTS
from timeline.storage.queue import FanoutQueues
from timeline.tools.azurite import Azurite, free_ports

TEXT = "x" * 120
"""Timeline-shaped entities: a short post text, like the worker writes."""
DELIVERIES = "fanout_deliveries_total"
POLL_S = 0.2
"""How often a phase scrapes the workers while it waits: each scrape costs a worker a few ms
of CPU (profiled: 6% of its CPU at 0.1 s), and a CPU-bound worker pays for it in rate."""
BENCH_OPTIONS = StorageOptions(timeout_s=30, placement_lease_s=3600)
"""The bench's own client: nothing rebalances here, so a placement read delayed by a
saturated Azurite must not stop the bench from routing."""

BENCH_IDLE = {"TIMELINE_WORKER_IDLE_SLEEP_S": "0.05", "TIMELINE_WORKER_IDLE_MAX_SLEEP_S": "0.05"}
"""The bench's workers poll every 0.05 s, without back-off (every receiver polls), as before
idle back-off: the phases stay comparable from run to run; the idle phase overrides it."""


def suffixed(result: dict[str, float], suffix: str, keep: tuple[str, ...] = ()) -> dict[str, float]:
    """``result`` with ``suffix`` appended to every key but ``keep``."""
    return {key if key in keep else f"{key}{suffix}": value for key, value in result.items()}


def scrubbed_env(**settings: str) -> dict[str, str]:
    """This process's environment without any ``TIMELINE_`` setting, plus ``settings``: a
    child configured only by what the bench chose."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMELINE_")}
    return env | settings


# --- Prometheus scrapes ----------------------------------------------------------------------


# --- CPU time --------------------------------------------------------------------------------


# --- Azurites and workers --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fresh_storage(accounts: int = 1) -> AsyncIterator[tuple[list[Azurite], Storage]]:
    """``accounts`` fresh in-memory Azurites, tables, placement and queue shards created."""
    azurites = [Azurite(location=None) for _ in range(accounts)]
    try:
        await asyncio.gather(*(asyncio.to_thread(a.start) for a in azurites))
        strings = [a.connection_string for a in azurites]
        async with Storage(strings, BENCH_OPTIONS) as storage:
            await storage.create_all()
            yield azurites, storage
    finally:
        await asyncio.gather(*(asyncio.to_thread(a.stop) for a in azurites))


class WorkerProcess:
    """A real ``fanout-worker`` process, observed through its metrics endpoint, RSS and CPU."""

    def __init__(self, azurites: Sequence[Azurite], **settings: str) -> None:
        """``settings``: extra ``TIMELINE_*`` variables (for the phases that need them)."""
        (self.port,) = free_ports(1)
        env = scrubbed_env(
            **{
                "TIMELINE_STORAGE_CONNECTION_STRINGS": "\n".join(
                    a.connection_string for a in azurites
                ),
                "TIMELINE_WORKER_METRICS_PORT": str(self.port),
                "TIMELINE_DATA_DIR": (data_dir := tempfile.mkdtemp(prefix="bench-")),
            }
            | BENCH_IDLE
            | settings
        )
        self.data_dir = Path(data_dir)
        self.log = self.data_dir / "worker.log"
        with self.log.open("wb") as log:  # its tail is shown if the phase fails
            self.process = subprocess.Popen(
                [sys.executable, "-m", "fanout_worker"], env=env, stderr=log
            )
        self.pid = self.process.pid
        self.session = aiohttp.ClientSession()

    async def metrics(self) -> dict[str, float]:
        return await scrape(self.session, f"http://127.0.0.1:{self.port}/metrics")

    async def ready(self) -> None:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                await self.metrics()
                return
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the worker did not start")
            await asyncio.sleep(0.1)

    def rss_mb(self) -> float:
        return float(psutil.Process(self.pid).memory_info().rss) / 2**20

    def cpu_s(self) -> float:
        return cpu_seconds(self.pid)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    async def stop(self) -> None:
        """SIGTERM, then remove its data folder (and log)."""
        await self.session.close()
        self.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(self.process.wait, 30)
        shutil.rmtree(self.data_dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def workers(
    azurites: Sequence[Azurite], count: int, **settings: str
) -> AsyncIterator[list[WorkerProcess]]:
    """``count`` worker processes on the same accounts (competing consumers)."""
    processes = [WorkerProcess(azurites, **settings) for _ in range(count)]
    try:
        await asyncio.gather(*(p.ready() for p in processes))
        yield processes
    except BaseException:
        for process in processes:
            print(f"worker {process.pid}'s log ends:\n{process.log_tail()}", file=sys.stderr)
        raise
    finally:
        await asyncio.gather(*(p.stop() for p in processes))


@contextlib.asynccontextmanager
async def worker(azurites: Sequence[Azurite], **settings: str) -> AsyncIterator[WorkerProcess]:
    async with workers(azurites, 1, **settings) as (process,):
        yield process


async def total(processes: Sequence[WorkerProcess], metric: str = DELIVERIES) -> float:
    """``metric`` summed over the worker processes."""
    scrapes = await asyncio.gather(*(p.metrics() for p in processes))
    return sum(samples.get(metric, 0.0) for samples in scrapes)


async def wait_for(
    processes: WorkerProcess | Sequence[WorkerProcess],
    metric: str,
    target: float,
    label: str,
    timeout_s: float = 900,
) -> float:
    """Poll the workers until ``metric`` (summed) reaches ``target``; return when it did
    (monotonic)."""
    group = [processes] if isinstance(processes, WorkerProcess) else list(processes)
    deadline = time.monotonic() + timeout_s
    with tqdm(total=int(target), desc=label, unit="ent", leave=False) as bar:
        while True:
            value = await total(group, metric)
            bar.n = int(value)
            bar.refresh()
            if value >= target:
                return time.monotonic()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: {value} of {target} after {timeout_s}s")
            await asyncio.sleep(POLL_S)


# --- seeding and posting ---------------------------------------------------------------------


async def bounded(
    tasks: Iterable[Awaitable[Any]], limit: int, bar: tqdm[Any] | None = None
) -> None:
    """Await ``tasks`` (a generator), ``limit`` at a time. Each is taken from the generator
    only when it is its turn and awaited at once: taking them all first left those still
    waiting for a turn created and never awaited when the run was cancelled."""
    pending = iter(tasks)

    async def take_turns() -> None:
        for task in pending:
            await task
            if bar is not None:
                bar.update()

    await asyncio.gather(*(take_turns() for _ in range(limit)))


async def write_rows(
    storage: Storage, table: str, rows: list[dict[str, Any]], label: str, *, in_flight: int = 16
) -> None:
    """Seed rows with EGT batches, grouped by partition."""
    by_partition: dict[str, list[Operation]] = {}
    for row in rows:
        by_partition.setdefault(row["PartitionKey"], []).append(("upsert", row))
    batches = [
        (partition, batch)
        for partition, operations in by_partition.items()
        for batch in chunked(operations)
    ]
    with tqdm(total=len(batches), desc=label, unit="batch", leave=False) as bar:
        await bounded(
            (submit_batch(storage, table, p, batch) for p, batch in batches), in_flight, bar
        )


def follower_rows(author: str, followers: Iterable[str]) -> list[dict[str, Any]]:
    since = datetime.now(UTC)
    return [{"PartitionKey": author, "RowKey": f, "since": since} for f in followers]


def timeline_entity(partition: str, ticks: int) -> dict[str, Any]:
    return Post(new_post_id(ticks), "author", TEXT).to_entity(partition)


async def publish(storage: Storage, post: Post, *, visible_in_s: int = 0) -> None:
    """What the API does for a post: the source row, then a small message on its shard."""
    await submit_batch(storage, POSTS, post.author, [("upsert", post.to_entity(post.author))])
    message = PostCreated(author=post.author, post_id=post.post_id)
    await (
        FanoutQueues(storage)
        .shard_for(message)
        .send_raw(encode(message), visible_in_s=visible_in_s or None)
    )


async def steady_posts(
    storage: Storage, authors: list[str], posts_per_s: float, seconds: float, label: str
) -> int:
    """Publish posts round-robin over ``authors`` at a steady rate; return how many."""
    count, started = int(posts_per_s * seconds), time.monotonic()
    pending: set[asyncio.Task[None]] = set()
    for i in tqdm(range(count), desc=label, unit="post", leave=False):
        await asyncio.sleep(max(0.0, started + i / posts_per_s - time.monotonic()))
        task = asyncio.create_task(
            publish(storage, Post(new_post_id(now_ticks()), authors[i % len(authors)], TEXT))
        )
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    return count
