"""Scaling: one fan-out workload on 1 account, on 2 accounts, and with 2 workers on 1 account.

Each run starts fresh Azurites and worker processes, seeds the same graph, and makes the
same backlog visible at one instant; the configurations alternate (A B C, then C B A, …)
so the machine's drift falls on all of them alike. CPU seconds of the workers, the
Azurites, the bench itself and everything else on the machine are taken over each drain:
on 2 cores they show which process the throughput waits for.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.burst import Graph, enqueue_backlog
from loadtest.bench.harness import (
    DELIVERIES,
    CpuMeter,
    azurite_pid,
    fresh_storage,
    profiled,
    total,
    wait_for,
    workers,
)
from loadtest.bench.sizes import Sizes

CONFIGURATIONS = {"1_account": (1, 1), "2_accounts": (2, 1), "2_workers": (1, 2)}
"""Name: (accounts, worker processes)."""


@dataclass(frozen=True)
class Run:
    eps: float
    cores: dict[str, float]
    """Cores busy on average during the drain, per role (see ``CpuMeter.cores``)."""
    cpu_ms_per_delivery: dict[str, float]


async def one_run(sizes: Sizes, configuration: str, round_: int, profile: Path | None) -> Run:
    accounts, worker_count = CONFIGURATIONS[configuration]
    name = f"scaling {configuration} #{round_ + 1}"
    graph = Graph(sizes.scaling_users, sizes.scaling_authors, sizes.scaling_followers)
    async with fresh_storage(accounts) as (azurites, storage):
        followers = await graph.seed_into(storage, f"{name}: seeding graph")
        async with workers(azurites, worker_count) as processes:
            lead_s = 2 + sizes.scaling_posts / 100
            _, expected = await enqueue_backlog(
                storage, followers, sizes.scaling_posts, lead_s, f"{name}: building backlog"
            )
            meter = CpuMeter(
                {
                    "worker": [p.pid for p in processes],
                    "azurite": [azurite_pid(a) for a in azurites],
                    "bench": [os.getpid()],
                }
            )
            before, cpu_before = await total(processes), meter.sample()
            with profiled([p.pid for p in processes], profile, f"{configuration}-{round_}"):
                done = await wait_for(processes, DELIVERIES, before + expected, f"{name}: draining")
            cpu_after, after = meter.sample(), await total(processes)
    deliveries = after - before
    cores = CpuMeter.cores(cpu_before, cpu_after)
    wall = cpu_after.at - cpu_before.at
    return Run(
        eps=deliveries / (done - cpu_before.at),
        cores=cores,
        cpu_ms_per_delivery={
            role: 1000 * cores[role] * wall / deliveries for role in ("worker", "azurite")
        },
    )


def summary(runs: list[Run]) -> dict[str, Any]:
    """Every run's rate, and the mean cores and CPU per delivery of each role."""
    return {
        "eps_runs": [r.eps for r in runs],
        "cores": {role: statistics.mean(r.cores[role] for r in runs) for role in runs[0].cores},
        "cpu_ms_per_delivery": {
            role: statistics.mean(r.cpu_ms_per_delivery[role] for r in runs)
            for role in runs[0].cpu_ms_per_delivery
        },
    }


async def scaling(sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    order = list(CONFIGURATIONS)
    runs: dict[str, list[Run]] = {name: [] for name in order}
    for round_ in range(sizes.scaling_rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            runs[name].append(await one_run(sizes, name, round_, profile))
    result: dict[str, Any] = {}
    for name, done in runs.items():
        azurite = statistics.mean(r.cores["azurite"] for r in done)
        worker = statistics.mean(r.cores["worker"] for r in done)
        result[f"fanout_eps_{name}"] = statistics.mean(r.eps for r in done)
        result[f"azurite_cpu_share_{name}"] = azurite / max(azurite + worker, 1e-9)
    result["fanout_scaling"] = {name: summary(done) for name, done in runs.items()}
    return result
