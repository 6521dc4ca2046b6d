"""``python -m loadtest.bench``: run the phases in order, print one JSON line last."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loadtest.bench.accounts import accounts
from loadtest.bench.api import api
from loadtest.bench.backfill import backfill
from loadtest.bench.backlog import backlog
from loadtest.bench.bigfanout import bigfanout_phase
from loadtest.bench.burst import burst
from loadtest.bench.cap import cap
from loadtest.bench.ceiling import ceilings
from loadtest.bench.crashloop import crashloop
from loadtest.bench.deletion import deletion
from loadtest.bench.follow_storm import follow_storm
from loadtest.bench.hybrid import hybrid
from loadtest.bench.idle import idle
from loadtest.bench.inactive import inactive
from loadtest.bench.late_pages import late_pages
from loadtest.bench.lists import lists
from loadtest.bench.live import live
from loadtest.bench.mutes import mutes
from loadtest.bench.reposts import reposts
from loadtest.bench.scaling import scaling
from loadtest.bench.sizes import QUICK, Sizes
from loadtest.bench.stream import stream

PHASES = (
    "live", "burst", "scaling", "backfill", "bigfanout", "accounts", "api", "hybrid", "cap",
    "stream", "backlog", "late_pages", "crashloop", "follow_storm", "idle", "inactive",
    "reposts", "mutes", "lists", "deletion",
)  # fmt: skip


def ratios(result: dict[str, Any]) -> dict[str, float]:
    def get(key: str) -> float:
        return float(result.get(key, math.nan))

    single, egt, one = (
        get("ceiling_single_eps"),
        get("ceiling_egt_eps"),
        get("fanout_eps_1_account"),
    )
    return {
        "live_vs_single": get("live_eps") / single,
        "burst_vs_single": get("burst_eps") / single,
        "worker_cpu_live_over_floor": get("worker_cpu_ms_per_delivery_live")
        / get("live_floor_cpu_ms_per_request"),
        "backfill_vs_egt": get("backfill_eps") / egt,
        "live_vs_adjacent_single": get("live_eps") / get("live_adjacent_single_eps"),
        "burst_vs_adjacent_single": get("burst_eps") / get("burst_adjacent_single_eps"),
        "fanout_2_accounts_vs_1": get("fanout_eps_2_accounts") / one,
        "fanout_2_workers_vs_1": get("fanout_eps_2_workers") / one,
        "merged_read_vs_plain": get("merged_read_p50_ms_5") / get("plain_read_p50_ms"),
        "timeline_rows_capped_vs_uncapped": get("timeline_rows_capped")
        / get("timeline_rows_uncapped"),
        "api_read_vs_floor": get("api_cpu_ms_per_read") / get("read_floor_cpu_ms"),
        "lean_vs_sdk_query_page": get("read_query_cpu_ms") / get("read_query_cpu_ms_sdk"),
        "lean_vs_sdk_batch_call": get("batch_call_cpu_ms") / get("batch_call_cpu_ms_sdk"),
        "lean_vs_sdk_upsert_call": get("upsert_call_cpu_ms") / get("upsert_call_cpu_ms_sdk"),
        "lean_vs_sdk_single_call": get("single_call_cpu_ms") / get("single_call_cpu_ms_sdk"),
        "lean_vs_sdk_queue_receive": get("queue_receive_cpu_ms") / get("queue_receive_cpu_ms_sdk"),
        "inactive_worker_cpu_on_vs_off": get("inactive_worker_cpu_ms_per_post")
        / get("inactive_worker_cpu_ms_per_post_off"),
        "inactive_return_vs_rebuilt_first_page": get("inactive_return_first_page_ms")
        / get("inactive_rebuilt_first_page_ms"),
    }


def rounded(value: Any) -> Any:
    """Floats to 3 decimals, inside lists and dicts too."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


async def run(sizes: Sizes, phases: set[str], profile: Path | None = None) -> dict[str, Any]:
    started = time.monotonic()
    result: dict[str, Any] = await ceilings(sizes)
    steps: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "live": lambda: live(sizes, result["ceiling_single_eps"], profile),
        "burst": lambda: burst(sizes),
        "scaling": lambda: scaling(sizes, profile),
        "backfill": lambda: backfill(sizes),
        "bigfanout": lambda: bigfanout_phase(sizes),
        "accounts": lambda: accounts(sizes),
        "api": lambda: api(sizes, profile),
        "hybrid": lambda: hybrid(sizes),
        "cap": lambda: cap(sizes),
        "stream": lambda: stream(sizes),
        "backlog": lambda: backlog(sizes, result["ceiling_single_eps"]),
        "late_pages": lambda: late_pages(sizes),
        "crashloop": lambda: crashloop(sizes),
        "follow_storm": lambda: follow_storm(sizes),
        "idle": lambda: idle(sizes),
        "inactive": lambda: inactive(sizes),
        "reposts": lambda: reposts(sizes),
        "mutes": lambda: mutes(sizes),
        "lists": lambda: lists(sizes),
        "deletion": lambda: deletion(sizes),
    }
    seconds = {"ceilings": time.monotonic() - started}
    for name in tqdm([p for p in PHASES if p in phases], desc="bench", unit="phase"):
        phase_started = time.monotonic()
        result |= await steps[name]()
        seconds[name] = time.monotonic() - phase_started
    result["ratios"] = ratios(result)
    result["phase_seconds"] = seconds | {"total": time.monotonic() - started}
    return {key: rounded(value) for key, value in result.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--phases", default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)} (ceilings always run)",
    )  # fmt: skip
    parser.add_argument(
        "--profile", type=Path, default=None,
        help="sample the workers (live, scaling) and the API (api) with py-spy into this folder",
    )  # fmt: skip
    args = parser.parse_args()
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases: {', '.join(sorted(unknown))}")
    # SIGTERM unwinds like Ctrl-C, so the worker and Azurite children are stopped too
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sizes = QUICK if args.quick else Sizes()
    print(json.dumps(asyncio.run(run(sizes, set(args.phases.split(",")), args.profile))))


if __name__ == "__main__":
    main()
