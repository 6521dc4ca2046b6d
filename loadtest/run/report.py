"""Locust's CSV into percentiles, and the latency plot."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from loadtest.bench.measure import histogram_quantile, quantile


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


def locust_log(path: Path, start: float, end: float) -> dict[str, list[float]]:
    """Response times (ms) by request name of the requests Locust started in [start, end)."""
    times: dict[str, list[float]] = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if start <= float(row["start"]) < end:
                times.setdefault(row["name"], []).append(float(row["ms"]))
    return times


def quantiles_ms(values: Sequence[float], name: str, suffix: str = "") -> dict[str, float | None]:
    """``{name}_p50_ms{suffix}``, p95 and p99 of ``values`` (None with fewer than 2)."""
    return {
        f"{name}_p{q}_ms{suffix}": round(quantile(values, q / 100), 1) if len(values) > 1 else None
        for q in (50, 95, 99)
    }


def route_quantile_ms(
    before: dict[str, float], after: dict[str, float], route: str, q: float
) -> float:
    """A quantile of the API's own ``timeline_http_request_duration_seconds`` for GETs of
    ``route`` answered 200 between two scrapes (linear within its buckets: 5, 10, 20, 50,
    100, 200 ms...)."""
    name = "timeline_http_request_duration_seconds"
    suffix = f",method=GET,route={route},status=200}}"

    def buckets(samples: dict[str, float]) -> dict[str, float]:
        return {
            f"{name}_bucket{{le={key.split('le=')[1].split(',')[0]}}}": value
            for key, value in samples.items()
            if key.startswith(f"{name}_bucket{{") and key.endswith(suffix)
        }

    return 1000 * histogram_quantile(buckets(before), buckets(after), name, q)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 2)
