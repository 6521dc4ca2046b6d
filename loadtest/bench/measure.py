"""What a benchmark measures: metrics scraped from /metrics, rates, quantiles, CPU, profiles."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Counter and histogram-bucket samples by name (labels folded into the name)."""
    async with session.get(url) as response:
        text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
    return samples


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def histogram_quantile(
    before: dict[str, float], after: dict[str, float], name: str, q: float
) -> float:
    """A quantile of the observations made between two scrapes (linear within a bucket)."""
    buckets = sorted(
        (float(key.split("le=")[1].rstrip("}")), delta(before, after, key))
        for key in after
        if key.startswith(f"{name}_bucket{{")
    )
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return math.nan
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


def rate(progress: list[tuple[float, float]], start: float, end: float) -> float:
    """Growth per second of ``(time, count)`` samples between ``start`` and ``end``."""
    inside = [(t, n) for t, n in progress if start <= t <= end]
    if len(inside) < 2:
        return math.nan
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / max(t1 - t0, 1e-9)


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0.01..0.99) of ``values``, interpolated."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def cpu_seconds(pid: int, *, children: bool = True) -> float:
    """User plus system CPU time of a process and (unless ``children`` is false) of its
    children, living or reaped."""
    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        process = psutil.Process(pid)
        for member in [process, *(process.children(recursive=True) if children else [])]:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = member.cpu_times()
                total += times.user + times.system
                if children:
                    total += times.children_user + times.children_system
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle, over every core."""
    times = psutil.cpu_times()
    return float(
        times.user
        + times.nice
        + times.system
        + getattr(times, "irq", 0.0)
        + getattr(times, "softirq", 0.0)
    )


@dataclass(frozen=True)
class CpuSample:
    at: float
    roles: dict[str, float]
    machine: float


class CpuMeter:
    """CPU seconds of named groups of processes (``worker``, ``azurite``, ``bench``) and of
    the whole machine, so a phase can say which process used the cores, and how much of the
    machine other people's work took meanwhile."""

    def __init__(self, roles: dict[str, Sequence[int]]) -> None:
        self.roles = roles

    def sample(self) -> CpuSample:
        """The bench's own process is counted without its children (the workers and
        Azurites it started have roles of their own)."""
        me = os.getpid()
        return CpuSample(
            time.monotonic(),
            {
                role: sum(cpu_seconds(pid, children=pid != me) for pid in pids)
                for role, pids in self.roles.items()
            },
            machine_busy_seconds(),
        )

    @staticmethod
    def cores(before: CpuSample, after: CpuSample) -> dict[str, float]:
        """Cores busy on average between two samples, per role, ``other`` (everything else
        on the machine) and ``machine``."""
        wall = max(after.at - before.at, 1e-9)
        used = {role: (after.roles[role] - before.roles[role]) / wall for role in after.roles}
        machine = (after.machine - before.machine) / wall
        return used | {"other": max(0.0, machine - sum(used.values())), "machine": machine}


@contextlib.contextmanager
def profiled(pids: Sequence[int], directory: Path | None, label: str) -> Iterator[None]:
    """With ``--profile DIR``: sample each process with py-spy while the block runs, into
    ``DIR/<label>-<i>.txt`` (collapsed stacks; idle time excluded, so the samples show
    where CPU time goes)."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    options = ["--rate", "100", "--format", "raw", "--nonblocking"]
    spies = [
        subprocess.Popen(  # noqa: S603 - a fixed command line
            [spy, "record", "--pid", str(pid), *options, "-o", f"{directory}/{label}-{i}.txt"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, pid in enumerate(pids)
    ]
    try:
        yield
    finally:
        for process in spies:
            process.send_signal(signal.SIGINT)
        for process in spies:
            process.wait(30)
