"""The capacity model's arithmetic (loadtest/capacity.py), on a bench line of known costs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = {
    "worker_cpu_ms_per_delivery_live": 1.34,
    "worker_cpu_ms_per_delivery_burst": 0.90,
    "api_cpu_ms_per_read": 7.9,
    "api_cpu_ms_per_post": 8.7,
    "follow_storm_api_cpu_ms_per_follow": 17.4,
}


def model(tmp_path: Path, bench: dict[str, float], shares: str) -> Any:
    line = tmp_path / "bench.json"
    line.write_text("progress output\n" + json.dumps(bench) + "\n")
    out = subprocess.run(  # noqa: S603 - our own module, our own arguments
        [sys.executable, "-m", "loadtest.capacity", str(line), "--inactive", shares],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def test_the_documented_sizing_of_twitter_scale_comes_back_from_its_costs(tmp_path: Path) -> None:
    """docs/capacity.md's first model (7,212 workers, 12,119 API processes) from its inputs."""
    twitter = model(tmp_path, BENCH, "0")["c_twitter_2013"]["inactive_0"]
    assert abs(twitter["worker_processes"] - 7212) / 7212 < 0.01
    assert abs(twitter["api_processes"] - 12119) / 12119 < 0.01


def test_inactive_readers_take_their_share_of_deliveries_off_the_workers(tmp_path: Path) -> None:
    result = model(tmp_path, BENCH, "0,0.7")["b_1m_users"]
    everyone, active = result["inactive_0"], result["inactive_0.7"]
    assert active["table_writes_per_s_peak"] == round(0.3 * everyone["table_writes_per_s_peak"], 1)
    assert active["worker_cores"] < 0.35 * everyone["worker_cores"] + 2
    assert active["api_processes"] == everyone["api_processes"]
