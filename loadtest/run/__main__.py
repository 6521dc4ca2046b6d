"""``python -m loadtest.run``: start and seed the stack, run Locust headless, sample the
fan-out queue depth every second, measure the same 250-item page read straight through the
SDK for comparison, write Locust's CSV and HTML and a PNG plot under ``loadtest/results/``,
and print one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.bench.harness import histogram_quantile, scrape, scrubbed_env
from loadtest.run.report import locust_stats, percentile, plot, work_queue_depth
from loadtest.run.stack import seed, stack
from timeline.azurite import free_ports
from timeline.config import Settings
from timeline.repositories import TimelinesRepository
from timeline.storage import Storage

RESULTS = Path("loadtest/results")


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
        await seed(seed_env, args.seed_users, tokens)
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
    parser = argparse.ArgumentParser(prog="python -m loadtest.run", description=__doc__)
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
