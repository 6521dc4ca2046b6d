"""Locust's CSV into percentiles, and the latency plot."""

from __future__ import annotations

import csv
from pathlib import Path


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
