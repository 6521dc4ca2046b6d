"""The load phase (Locust and the probe at the same moments), the drain, the idle phase."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtest.bench.measure import CpuMeter, cpu_seconds, profiled, scrape
from loadtest.run.report import work_queue_depth

Samples = dict[str, dict[str, list[tuple[float, float]]]]
"""The probe's reads: ``[start time, ms]`` by source (raw, api) and reader kind."""


class Probe:
    """The ``loadtest.run.probe`` process, driven over its stdin and stdout."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n".encode())
        await self.process.stdin.drain()

    async def receive(self, timeout_s: float = 120) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout_s)
        if not line:
            raise RuntimeError("the probe exited")
        return line.decode().strip()

    async def samples(self) -> Samples:
        result: Samples = json.loads(await self.receive())
        return result


@contextlib.asynccontextmanager
async def probe_process(
    env: dict[str, str], base: str, tokens: Path, *options: str
) -> AsyncIterator[Probe]:
    """``python -m loadtest.run.probe`` with ``options`` (e.g. ``--idle-full 300``)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.run.probe", "--base", base, "--tokens", str(tokens),
        *options, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, limit=2**24,
    )  # fmt: skip
    probe = Probe(process)
    try:
        if await probe.receive() != "ready":
            raise RuntimeError("the probe did not start")
        yield probe
    finally:
        if process.returncode is None:
            assert process.stdin is not None
            process.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 10)
        if process.returncode is None:
            process.kill()
            await process.wait()


@dataclass
class Load:
    """What the load window measured (its start and end are ``time.time()``)."""

    start: float = 0.0
    end: float = 0.0
    probe: Samples = field(default_factory=dict)
    api_before: dict[str, float] = field(default_factory=dict)
    api_after: dict[str, float] = field(default_factory=dict)
    worker_before: dict[str, float] = field(default_factory=dict)
    worker_after: dict[str, float] = field(default_factory=dict)
    cores: dict[str, float] = field(default_factory=dict)
    depth_max: float = 0.0
    series: list[tuple[float, float, float]] = field(default_factory=list)
    """Once a second: time, the work queues' depth, the worker's deliveries so far."""
    cpu_series: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    """Once a second in the window: time, and the cores each role used since the last
    sample (so a slow second can be put down to Azurite, the API, or other people; here
    ``other`` includes Locust's 0.03 to 0.04 of a core)."""


async def under_load(
    args: Any,
    env: dict[str, str],
    urls: dict[str, str],
    probe: Probe,
    roles: dict[str, list[int]],
    results: Path,
) -> Load:
    """Locust headless for ``args.seconds``; once all its users run (after the ramp), the
    window starts: the probe reads until Locust ends, and the API's metrics and every
    process's CPU are taken over the same window. Locust's CPU is sampled every second while
    it runs (it is gone when the window ends)."""
    load, prefix = Load(), results / "locust"
    async with aiohttp.ClientSession() as session:
        load.worker_before = await scrape(session, urls["worker"])
        spawn_rate = max(1, args.users // 5)
        locust = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless",
            "-u", str(args.users), "-r", str(spawn_rate),
            "-t", f"{args.seconds}s", "--host", urls["base"], "--csv", str(prefix),
            "--csv-full-history", "--html", str(results / "locust.html"), "--only-summary",
            env=env | {"TIMELINE_LOADTEST_REQUEST_LOG": str(results / "requests.csv")},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        groups: dict[str, Sequence[int]] = {**roles, "probe": [probe.process.pid]}
        meter = CpuMeter(groups | {"run": [os.getpid()]})
        pids = [pid for role in ("api", "worker") for pid in roles[role]] + [locust.pid]
        steady_at = time.monotonic() + args.users / spawn_rate + 1
        locust_cpu: list[float] = []
        with profiled(pids, args.profile, "load"):
            while locust.returncode is None:
                if not load.start and time.monotonic() >= steady_at:
                    load.start, cpu_before = time.time(), meter.sample()
                    last = cpu_before
                    locust_cpu = [cpu_seconds(locust.pid)]
                    load.api_before = await scrape(session, urls["api"])
                    await probe.send("go")
                with contextlib.suppress(aiohttp.ClientError):
                    samples = await scrape(session, urls["worker"])
                    depth = work_queue_depth(samples)
                    load.depth_max = max(load.depth_max, depth)
                    deliveries = samples.get("fanout_deliveries_total", 0.0)
                    load.series.append((time.time(), depth, deliveries))
                if locust_cpu:  # Locust's own CPU, while it still runs
                    locust_cpu.append(cpu_seconds(locust.pid) or locust_cpu[-1])
                    now = meter.sample()
                    load.cpu_series.append((time.time(), CpuMeter.cores(last, now)))
                    last = now
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(locust.wait(), 1.0)
            if not load.start:
                raise RuntimeError("Locust ended before its users were all running")
            load.end, cpu_after = time.time(), meter.sample()
            await probe.send("stop")
            load.probe = await probe.samples()
        load.api_after = await scrape(session, urls["api"])
        load.cores = CpuMeter.cores(cpu_before, cpu_after)
        load.cores["locust"] = (locust_cpu[-1] - locust_cpu[0]) / (load.end - load.start)
        load.cores["other"] = max(0.0, load.cores["other"] - load.cores["locust"])
        await drain(session, urls["worker"])
        load.worker_after = await scrape(session, urls["worker"])
    return load


async def drain(session: aiohttp.ClientSession, url: str, timeout_s: float = 60) -> None:
    """Until the worker has delivered what the run queued: empty work queues and no new
    delivery for two scrapes a second apart (or ``timeout_s``)."""
    deadline, last, quiet = time.monotonic() + timeout_s, -1.0, 0
    while quiet < 2 and time.monotonic() < deadline:
        samples = await scrape(session, url)
        deliveries = samples.get("fanout_deliveries_total", 0.0)
        busy = work_queue_depth(samples) > 0 or deliveries != last
        quiet, last = 0 if busy else quiet + 1, deliveries
        await asyncio.sleep(1.0)
