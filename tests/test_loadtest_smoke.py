"""``make loadtest`` runs end to end at tiny sizes: seeding, Locust, the JSON line, the plot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

KEYS = {
    "users", "duration_s", "rps", "failures", "read_p50_ms", "read_p95_ms", "read_p99_ms",
    "post_p50_ms", "raw_page_query_p50_ms", "fanout_lag_p99_s", "queue_depth_max",
    "merged_read_p50_ms", "merged_read_p95_ms", "merged_read_p99_ms", "large_authors",
}  # fmt: skip


async def test_loadtest_quick_run_has_no_failures() -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "loadtest.run", "--users", "5", "--seconds", "8",
         "--seed-users", "200", "--large-threshold", "100"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) >= KEYS
    assert result["failures"] == 0
    assert result["rps"] > 0
    assert result["large_authors"] > 0  # the top accounts are merged at read time,
    assert result["merged_read_p50_ms"] is not None  # and their followers' reads merge them
    assert await asyncio.to_thread(lambda: Path("loadtest/results/latency.png").stat().st_size)
