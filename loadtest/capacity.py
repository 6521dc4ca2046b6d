"""``python -m loadtest.capacity BENCH.json``: docs/capacity.md's process counts from one
``make bench`` line, for each workload and share of inactive readers.

The workloads and sizing rules are the assumptions of docs/capacity.md (sections 3 and 4);
the CPU per operation comes from the bench line. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PEAK = 3.0
"""Peak over average (docs/capacity.md, section 3)."""
CORE_TARGET = 0.6
"""A process is planned at 60% of a core at peak."""
BACKFILL_ROWS = 250
"""Rows a follow copies in."""
FOLLOW_SHARE = 0.8
"""Follows among follows and unfollows (0.2 and 0.05 per user per day)."""


@dataclass(frozen=True)
class Workload:
    """Average rates per second (docs/capacity.md, section 4)."""

    posts: float
    reads: float
    audience: float
    follows: float
    """Follows and unfollows."""

    @property
    def deliveries(self) -> float:
        return self.posts * self.audience


WORKLOADS = {
    "a_10k_users": Workload(posts=0.2315, reads=11.57, audience=100, follows=0.0289),
    "b_1m_users": Workload(posts=23.15, reads=1157, audience=200, follows=2.894),
    "c_twitter_2013": Workload(posts=5000, reads=300_000, audience=200, follows=578.7),
}


def processes(cores: float) -> int:
    return math.ceil(cores / CORE_TARGET)


def sizing(bench: dict[str, Any], load: Workload, inactive: float) -> dict[str, float]:
    """Worker and API processes at peak; ``inactive``: the share of deliveries whose reader
    has not read for TIMELINE_INACTIVE_DAYS (skipped, `inactive_deliveries_saved`)."""
    live_ms = bench.get(  # an idle worker's polling is not per delivery (it backs off)
        "worker_cpu_ms_per_delivery_live_above_idle", bench["worker_cpu_ms_per_delivery_live"]
    )
    burst_ms = bench["worker_cpu_ms_per_delivery_burst"]
    read_ms = bench["api_cpu_ms_per_read"]
    post_ms = bench["api_cpu_ms_per_post"]
    follow_ms = bench.get("follow_storm_api_cpu_ms_per_follow", 2 * post_ms)
    deliveries = PEAK * load.deliveries * (1 - inactive)
    backfilled = PEAK * load.follows * FOLLOW_SHARE * BACKFILL_ROWS
    worker_cores = (deliveries * live_ms + backfilled * burst_ms) / 1000
    api_cores = PEAK * (load.reads * read_ms + load.posts * post_ms + load.follows * follow_ms)
    api_cores /= 1000
    return {
        "worker_cores": round(worker_cores, 2),
        "worker_processes": processes(worker_cores),
        "api_cores": round(api_cores, 2),
        "api_processes": processes(api_cores),
        "table_writes_per_s_peak": round(deliveries, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bench", type=Path, help="a file holding make bench's JSON line")
    parser.add_argument(
        "--inactive", default="0,0.5,0.7",
        help="comma-separated shares of deliveries to inactive readers",
    )  # fmt: skip
    args = parser.parse_args()
    bench = json.loads(args.bench.read_text().strip().splitlines()[-1])
    shares = [float(share) for share in args.inactive.split(",")]
    result = {
        name: {f"inactive_{share:g}": sizing(bench, load, share) for share in shares}
        for name, load in WORKLOADS.items()
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
