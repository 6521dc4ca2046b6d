"""``python -m loadtest.run``: start and seed the stack, then in one window run Locust
headless and the side-by-side probe (``loadtest.run.probe``: the same first pages read
straight through the SDK and through the API, from a process of its own, and full pages of
250 posts of readers of its own), sample the
fan-out queue depth every second and every process's CPU; let the worker drain, run the
probe again at idle; write Locust's CSV, HTML and request log, the probe's samples and a PNG
plot under ``loadtest/results/``, and print one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tempfile
from pathlib import Path
from typing import Any

from loadtest.bench.harness import scrubbed_env
from loadtest.bench.measure import histogram_quantile
from loadtest.run.load import Load, Samples, probe_process, under_load
from loadtest.run.report import (
    locust_log,
    locust_stats,
    percentile,
    plot,
    quantiles_ms,
    ratio,
    route_quantile_ms,
)
from loadtest.run.stack import roles, seed, stack, storage
from timeline.tools.azurite import free_ports

RESULTS = Path("loadtest/results")
TIMELINE_ROUTE = "/users/{user_id}/timeline"


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
    tokens = RESULTS / "tokens.json"
    urls = {
        "base": base,
        "api": f"{base}/metrics",
        "worker": f"http://127.0.0.1:{metrics_port}/metrics",
    }
    async with storage(env, disk=args.azurite_disk) as env, stack(env, base):
        seed_env = env | {"TIMELINE_LOADTEST_TOKENS": str(tokens)}
        await seed(seed_env, args.seed_users, tokens)
        full = ("--idle-full", str(args.idle_full_reads))
        async with probe_process(seed_env, base, tokens, *full) as probe:
            load = await under_load(args, seed_env, urls, probe, roles(), RESULTS)
            await probe.send("idle")
            idle = await probe.samples()
    (RESULTS / "side_by_side.json").write_text(json.dumps({"load": load.__dict__, "idle": idle}))
    plot(RESULTS / "locust", RESULTS / "latency.png")
    return summary(args, load, idle)


def summary(args: argparse.Namespace, load: Load, idle: Samples) -> dict[str, Any]:
    stats = locust_stats(RESULTS / "locust")
    aggregated = stats["Aggregated"]
    logged = locust_log(RESULTS / "requests.csv", load.start, load.end)

    def ms(samples: list[tuple[float, float]]) -> list[float]:
        return [value for _, value in samples]

    result: dict[str, Any] = {
        "users": args.users,
        "azurite": "disk" if args.azurite_disk else "memory",
        "duration_s": args.seconds,
        "window_s": round(load.end - load.start, 1),
        "rps": round(float(aggregated["Requests/s"]), 1),
        "failures": int(aggregated["Failure Count"]),
        "reads": sum(int(r["Request Count"]) for n, r in stats.items() if n.startswith("read:")),
        **quantiles_ms(logged.get("read: timeline", []), "read"),
        **quantiles_ms(logged.get("read: timeline (merged)", []), "merged_read"),
        **quantiles_ms(ms(load.probe["raw"]["plain"]), "raw_page_query", "_under_load"),
        **quantiles_ms(ms(load.probe["raw"]["merged"]), "raw_merged_read", "_under_load"),
        **quantiles_ms(ms(load.probe["api"]["plain"]), "probe_read", "_under_load"),
        **quantiles_ms(ms(load.probe["api"]["merged"]), "probe_merged_read", "_under_load"),
        **quantiles_ms(ms(idle["raw"]["plain"]), "raw_page_query", "_idle"),
        **quantiles_ms(ms(idle["raw"]["merged"]), "raw_merged_read", "_idle"),
        **quantiles_ms(ms(idle["api"]["plain"]), "api_idle_read"),
        **quantiles_ms(ms(idle["api"]["merged"]), "api_idle_merged_read"),
        **quantiles_ms(ms(idle["api"]["full"]), "api_read", "_idle"),
        **quantiles_ms(ms(idle["raw"]["full"]), "raw_read", "_idle"),
        **quantiles_ms(ms(load.probe["api"]["full"]), "api_read", "_load"),
        **quantiles_ms(ms(load.probe["raw"]["full"]), "raw_read", "_load"),
        **{
            f"server_read_p{q}_ms": round(
                route_quantile_ms(load.api_before, load.api_after, TIMELINE_ROUTE, q / 100), 1
            )
            for q in (50, 95, 99)
        },
    }
    result |= {
        "api_over_raw_under_load": ratio(
            result["read_p50_ms"], result["raw_page_query_p50_ms_under_load"]
        ),
        "api_over_raw_idle": ratio(
            result["api_idle_read_p50_ms"], result["raw_page_query_p50_ms_idle"]
        ),
        "merged_api_over_raw_under_load": ratio(
            result["merged_read_p50_ms"], result["raw_merged_read_p50_ms_under_load"]
        ),
        "merged_api_over_raw_idle": ratio(
            result["api_idle_merged_read_p50_ms"], result["raw_merged_read_p50_ms_idle"]
        ),
        "probe_api_over_raw_under_load": ratio(
            result["probe_read_p50_ms_under_load"], result["raw_page_query_p50_ms_under_load"]
        ),
        "api_over_raw_read_p50_idle": ratio(
            result["api_read_p50_ms_idle"], result["raw_read_p50_ms_idle"]
        ),
        "api_over_raw_read_p50_load": ratio(
            result["api_read_p50_ms_load"], result["raw_read_p50_ms_load"]
        ),
        "read_p99_over_p50": ratio(result["read_p99_ms"], result["read_p50_ms"]),
        "merged_read_p99_over_p50": ratio(
            result["merged_read_p99_ms"], result["merged_read_p50_ms"]
        ),
        "post_p50_ms": percentile(stats, "write: post", "50%"),
        "large_authors": len(json.loads((RESULTS / "hybrid.json").read_text())["large_authors"]),
        "fanout_lag_p99_s": round(
            histogram_quantile(
                load.worker_before, load.worker_after, "fanout_delivery_lag_seconds", 0.99
            ),
            3,
        ),
        "queue_depth_max": int(load.depth_max),
        "cores": {role: round(value, 2) for role, value in load.cores.items()},
        "probe_reads": {
            f"{source}_{kind}_{phase}": len(samples[source][kind])
            for phase, samples in (("under_load", load.probe), ("idle", idle))
            for source in ("raw", "api", "raw_failed", "api_failed")
            for kind in ("plain", "merged", "full")
        },
    }
    return result


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
    parser.add_argument(
        "--azurite-disk", action="store_true",
        help="timeline run's embedded, file-backed Azurite (saves its database every 5 s) "
        "instead of an in-memory one",
    )  # fmt: skip
    parser.add_argument(
        "--idle-full-reads", type=int, default=300,
        help="full pages (250 posts) read at idle, each through the API and raw, one at a time",
    )  # fmt: skip
    parser.add_argument(
        "--profile", type=Path, default=None,
        help="sample the API, the worker and Locust with py-spy during the load, into this folder",
    )  # fmt: skip
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(json.dumps(asyncio.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
