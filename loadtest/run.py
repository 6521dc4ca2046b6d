"""``make loadtest``: the whole stack on free ports, seeded, under Locust; one JSON line.

Starts ``timeline run`` (embedded Azurite, API, one worker with metrics), seeds the graph,
runs Locust headless, samples the fan-out queue depth every second, measures the same
250-item page read straight through the SDK for comparison, writes Locust's CSV and HTML and
a PNG plot under ``loadtest/results/``, and prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.bench.harness import histogram_quantile, scrape, scrubbed_env
from timeline.azurite import free_ports
from timeline.config import Settings
from timeline.repositories import TimelinesRepository
from timeline.storage import Storage

RESULTS = Path("loadtest/results")


@contextlib.asynccontextmanager
async def stack(env: dict[str, str], base: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(  # noqa: ASYNC220 - starts our own stack, once
        [sys.executable, "-m", "timeline.cli", "run"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 90
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{base}/readyz") as response:
                        if response.status == 200:
                            break
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the stack did not become ready")
                await asyncio.sleep(0.2)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 60)


async def raw_page_p50_ms(settings: Settings, users: list[str], reads: int = 200) -> float:
    """The page the API serves (a random user's first 250), read straight through the SDK."""
    rng = random.Random(1)
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        timelines = TimelinesRepository(storage)
        timings = []
        for _ in range(reads):
            owner = rng.choice(users)
            started = time.perf_counter()
            await timelines.page(owner, 250, None)
            timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def work_queue_depth(samples: dict[str, float]) -> float:
    """Messages waiting in every work shard ``fanout-<k>`` (not in their poison queues)."""
    prefix = "fanout_queue_depth{queue=fanout-"
    return sum(
        value
        for key, value in samples.items()
        if key.startswith(prefix) and not key.endswith("-poison}")
    )


def locust_stats(prefix: Path) -> dict[str, dict[str, str]]:
    with open(f"{prefix}_stats.csv", newline="") as handle:
        return {row["Name"]: row for row in csv.DictReader(handle)}


def percentile(stats: dict[str, dict[str, str]], name: str, column: str) -> float | None:
    """A request kind's percentile, or None when a short run never made that request."""
    row = stats.get(name)
    return float(row[column]) if row is not None else None


def plot(prefix: Path, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(f"{prefix}_stats_history.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["Name"] == "Aggregated"]
    start = float(rows[0]["Timestamp"])
    seconds = [float(r["Timestamp"]) - start for r in rows]
    figure, (latency, throughput) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for column in ("50%", "95%", "99%"):
        values = [float(r[column]) if r[column] not in ("", "N/A") else float("nan") for r in rows]
        latency.plot(seconds, values, label=f"p{column.rstrip('%')}")
    latency.set_ylabel("latency (ms)")
    latency.legend()
    latency.set_title("Timeline service under Locust (all requests)")
    throughput.plot(seconds, [float(r["Requests/s"]) for r in rows], color="tab:green")
    throughput.set_ylabel("requests/s")
    throughput.set_xlabel("seconds")
    figure.tight_layout()
    figure.savefig(output, dpi=100)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    RESULTS.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, at start
    data_dir = Path(tempfile.mkdtemp(prefix="loadtest-"))
    api_port, metrics_port = free_ports(2)
    base = f"http://127.0.0.1:{api_port}"
    env = scrubbed_env(
        TIMELINE_DATA_DIR=str(data_dir),
        TIMELINE_PORT=str(api_port),
        TIMELINE_WORKER_METRICS_PORT=str(metrics_port),
        TIMELINE_POSTS_PER_MINUTE="0",
        TIMELINE_WRITES_PER_MINUTE="0",
        TIMELINE_FANOUT_ON_READ_FOLLOWERS=str(args.large_threshold),
    )
    settings = Settings(data_dir=data_dir)
    tokens = RESULTS / "tokens.json"
    async with stack(env, base):
        seed_env = env | {"TIMELINE_LOADTEST_TOKENS": str(tokens)}
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "loadtest.seed", "--users", str(args.seed_users),
             "--tokens", str(tokens)],
            env=seed_env, check=True,
        )  # fmt: skip
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        prefix = RESULTS / "locust"
        async with aiohttp.ClientSession() as session:
            before = await scrape(session, metrics_url)
            locust = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless",
                "-u", str(args.users), "-r", str(max(1, args.users // 5)),
                "-t", f"{args.seconds}s", "--host", base, "--csv", str(prefix),
                "--csv-full-history", "--html", str(RESULTS / "locust.html"), "--only-summary",
                env=seed_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            depth_max = 0.0
            while locust.returncode is None:
                with contextlib.suppress(aiohttp.ClientError):
                    samples = await scrape(session, metrics_url)
                    depth_max = max(depth_max, work_queue_depth(samples))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(locust.wait(), 1.0)
            await asyncio.sleep(5)  # let the worker finish what the run queued
            after = await scrape(session, metrics_url)
        raw_p50 = await raw_page_p50_ms(settings, sorted(json.loads(tokens.read_text())))
    stats = locust_stats(prefix)
    aggregated = stats["Aggregated"]
    plot(prefix, RESULTS / "latency.png")
    return {
        "users": args.users,
        "duration_s": args.seconds,
        "rps": round(float(aggregated["Requests/s"]), 1),
        "failures": int(aggregated["Failure Count"]),
        "read_p50_ms": percentile(stats, "read: timeline", "50%"),
        "read_p95_ms": percentile(stats, "read: timeline", "95%"),
        "read_p99_ms": percentile(stats, "read: timeline", "99%"),
        "merged_read_p50_ms": percentile(stats, "read: timeline (merged)", "50%"),
        "merged_read_p95_ms": percentile(stats, "read: timeline (merged)", "95%"),
        "merged_read_p99_ms": percentile(stats, "read: timeline (merged)", "99%"),
        "large_authors": len(json.loads((RESULTS / "hybrid.json").read_text())["large_authors"]),
        "reads": sum(int(r["Request Count"]) for n, r in stats.items() if n.startswith("read:")),
        "post_p50_ms": percentile(stats, "write: post", "50%"),
        "raw_page_query_p50_ms": round(raw_p50, 1),
        "fanout_lag_p99_s": round(
            histogram_quantile(before, after, "fanout_delivery_lag_seconds", 0.99), 3
        ),
        "queue_depth_max": int(depth_max),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--seed-users", type=int, default=5000)
    parser.add_argument(
        "--large-threshold", type=int, default=500,
        help="TIMELINE_FANOUT_ON_READ_FOLLOWERS for the run: the seeded graph's top accounts "
        "(3,000 to 500 followers) are merged at read time",
    )  # fmt: skip
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
