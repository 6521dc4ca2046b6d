"""``make loadtest`` runs end to end at tiny sizes: seeding, Locust, the JSON line, the plot.

The quick twin runs it smaller and shorter: too few reads for every percentile, enough to
prove each step runs, fails nothing and writes its plot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

KEYS = {
    "users", "duration_s", "rps", "failures", "read_p50_ms", "read_p95_ms", "read_p99_ms",
    "post_p50_ms", "fanout_lag_p99_s", "queue_depth_max",
    "merged_read_p50_ms", "merged_read_p95_ms", "merged_read_p99_ms", "large_authors",
    "raw_page_query_p50_ms_under_load", "raw_page_query_p95_ms_under_load",
    "raw_page_query_p99_ms_under_load", "raw_page_query_p50_ms_idle", "api_idle_read_p50_ms",
    "api_over_raw_under_load", "api_over_raw_idle", "read_p99_over_p50",
    "raw_merged_read_p50_ms_under_load", "raw_merged_read_p50_ms_idle",
    "api_idle_merged_read_p50_ms", "merged_api_over_raw_under_load", "merged_api_over_raw_idle",
    "server_read_p50_ms", "server_read_p99_ms", "cores", "probe_reads",
}  # fmt: skip
FULL_PAGE_KEYS = (
    "api_read_p50_ms_idle", "api_read_p99_ms_idle", "raw_read_p50_ms_idle",
    "api_read_p50_ms_load", "raw_read_p50_ms_load",
    "api_over_raw_read_p50_idle", "api_over_raw_read_p50_load",
)  # fmt: skip
"""Full pages (250 posts) read through the API and raw, at idle and beside Locust."""
PLOT = Path("loadtest/results/latency.png")


async def loadtest(users: int, seconds: int, full_reads: int) -> dict[str, Any]:
    """``python -m loadtest.run`` on 200 seeded users: its JSON line. The plot of an
    earlier run is removed first."""
    await asyncio.to_thread(PLOT.unlink, missing_ok=True)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "loadtest.run", "--users", str(users), "--seconds", str(seconds),
         "--seed-users", "200", "--large-threshold", "100",
         "--idle-full-reads", str(full_reads)],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def test_a_short_loadtest_has_no_failures_and_plots() -> None:
    result = await loadtest(users=3, seconds=5, full_reads=10)
    assert set(result) >= KEYS
    assert result["failures"] == 0
    assert result["rps"] > 0
    assert result["large_authors"] > 0
    assert result["probe_reads"]["api_full_idle"] == 10
    assert result["probe_reads"]["api_failed_full_idle"] == 0
    assert await asyncio.to_thread(lambda: PLOT.stat().st_size)


@pytest.mark.long
@pytest.mark.timeout(600)
async def test_loadtest_quick_run_has_no_failures() -> None:
    result = await loadtest(users=5, seconds=15, full_reads=40)
    assert set(result) >= KEYS
    assert result["failures"] == 0
    assert result["rps"] > 0
    assert result["large_authors"] > 0  # the top accounts are merged at read time,
    assert result["merged_read_p50_ms"] is not None  # and their followers' reads merge them
    # the probe read beside Locust (same window) and again at idle, raw and through the API
    assert result["raw_merged_read_p50_ms_under_load"] is not None
    assert result["merged_api_over_raw_idle"] is not None
    assert result["probe_reads"]["api_merged_idle"] > 0
    for key in FULL_PAGE_KEYS:  # numbers, not None (too few reads) nor a bool
        assert type(result[key]) in (int, float), (key, result[key])
        assert result[key] > 0, (key, result[key])
    assert result["probe_reads"]["api_full_idle"] == 40
    assert result["probe_reads"]["api_failed_full_idle"] == 0
    assert await asyncio.to_thread(lambda: PLOT.stat().st_size)
