"""The benchmark runs end to end at tiny sizes and prints its JSON line (no speed asserted).

Every phase is long (five minutes here); the quick twin runs the storage ceilings and two
short phases, which proves the entry point, the harness and the JSON line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

KEYS = {
    "ceiling_single_eps", "ceiling_egt_eps", "live_eps", "live_requests_per_delivery",
    "lag_p50_s", "lag_p99_s", "burst_eps", "burst_requests_per_delivery", "backfill_eps",
    "bigfanout_followers", "bigfanout_delivered", "bigfanout_finished", "bigfanout_s",
    "bigfanout_rss_mb", "azurite_same_rowkey_eps", "ratios", "live_adjacent_single_eps",
    "burst_adjacent_single_eps", "crashloop_poisoned",
}  # fmt: skip
POSITIVE = {
    "block_check_requests_per_read", "mute_read_p50_ms", "unmuted_read_p50_ms",
    "mute_read_p50_ratio",
    "list_delivery_requests_per_post", "list_read_p50_ms", "home_read_p50_ms",
    "list_read_p50_ratio", "account_delete_s", "account_delete_requests",
    "accounts_balance_max_over_mean", "accounts_rows_max_over_mean", "fanout_eps_1_account",
    "fanout_eps_2_accounts", "fanout_eps_2_workers", "worker_cpu_ms_per_delivery_live",
    "worker_cpu_ms_per_delivery_burst", "azurite_cpu_share_1_account",
    "azurite_cpu_share_2_accounts", "azurite_cpu_share_2_workers", "api_cpu_ms_per_read",
    "api_cpu_ms_per_post", "api_storage_requests_per_read", "api_storage_requests_per_post",
    "stream_requests_per_client_minute", "stream_requests_per_client_minute_merging_5",
    "stream_event_latency_p50_ms", "follow_storm_p50_ms", "follow_storm_p99_ms",
    "follow_storm_storage_requests_per_follow", "follow_storm_point_write_p50_ms",
    "live_floor_cpu_ms_per_request", "worker_idle_cores_live",
    "read_query_cpu_ms", "read_query_cpu_ms_sdk", "batch_call_cpu_ms", "batch_call_cpu_ms_sdk",
    "upsert_call_cpu_ms", "upsert_call_cpu_ms_sdk", "single_call_cpu_ms", "single_call_cpu_ms_sdk",
    "queue_send_cpu_ms", "queue_send_cpu_ms_sdk", "queue_receive_cpu_ms",
    "queue_receive_cpu_ms_sdk", "queue_update_cpu_ms", "queue_update_cpu_ms_sdk",
    "queue_delete_cpu_ms", "queue_delete_cpu_ms_sdk", "queue_empty_receive_cpu_ms",
    "queue_empty_receive_cpu_ms_sdk",
    "inactive_worker_cpu_ms_per_post",
    "inactive_worker_cpu_ms_per_post_off", "inactive_return_first_page_ms",
    "inactive_rebuilt_first_page_ms", "inactive_wake_s",
    "inactive_return_first_page_storage_requests",
}  # fmt: skip
"""Keys of the several-accounts, CPU and API-cost measurements: present, and positive."""


async def bench(*options: str) -> dict[str, Any]:
    """``python -m loadtest.bench --quick`` with ``options``: its JSON line."""
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "loadtest.bench", "--quick", *options],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def test_two_phases_print_the_ceilings_and_their_keys() -> None:
    result = await bench("--phases", "mutes,lists,deletion")
    assert result["ceiling_single_eps"] > 0
    assert result["ceiling_egt_eps"] > 0
    keys = {"mute_read_p50_ms", "unmuted_read_p50_ms", "mute_read_p50_ratio"}
    keys |= {"filter_read_p50_ms", "filter_read_p50_ratio"}
    keys |= {"list_read_p50_ms", "home_read_p50_ms", "list_read_p50_ratio"}
    assert all(result[key] > 0 for key in keys), {key: result.get(key) for key in keys}
    # a copy per list per post, and now and then a trim of a list's timeline (1 in 50)
    assert 1.0 <= result["list_delivery_requests_per_post"] < 1.5
    assert result["account_delete_s"] > 0
    # per follower: its unfollow's two passes (purge, index); per post: its delete's passes
    assert result["account_delete_requests"] > 20 + 10
    assert set(result["phase_seconds"]) == {"ceilings", "mutes", "lists", "deletion", "total"}


@pytest.mark.long
@pytest.mark.timeout(1500)
async def test_bench_quick_prints_every_key() -> None:
    result = await bench()
    assert set(result) >= KEYS | POSITIVE
    assert all(result[key] > 0 for key in POSITIVE), {key: result[key] for key in POSITIVE}
    assert result["accounts_balance_max_over_mean"] <= 1.1
    assert len(result["accounts_rows"]) == 3
    for configuration in ("1_account", "2_accounts", "2_workers"):
        assert result["fanout_scaling"][configuration]["cores"]["worker"] > 0
    assert result["bigfanout_finished"] is True
    assert result["follow_storm_counted_exactly"] is True
    assert result["bigfanout_delivered"] == result["bigfanout_followers"] + 1
    assert result["burst_eps"] > 0
    assert result["live_eps"] > 0
    assert result["ratios"]["live_vs_adjacent_single"] > 0
    assert 0 < result["bigfanout_rss_mb"] < 1000
    # 70% of the followers dormant: about that share of the copies is skipped
    assert 0.5 < result["inactive_deliveries_saved"] < 0.75
    # one timeline query per reader per repost delivery; half of a reply's audience follows both
    assert result["repost_dedupe_requests_per_delivery"] == 1.0
    assert result["reply_follow_checks_per_page"] == 1.0
    assert result["reply_copies_share"] == 0.5
