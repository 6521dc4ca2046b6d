"""Scaling: one fan-out workload on 1 account, on 2 accounts, and with 2 workers on 1 account.

The follower graph is seeded once on one fresh Azurite and once over two; each run starts
fresh worker processes and makes a new backlog of posts visible at one instant. The
configurations alternate (A B C, then C B A, …), so the machine's drift, and the rows the
earlier runs left on the same Azurite, fall on all of them alike. CPU seconds of the
workers, the Azurites, the bench itself and everything else on the machine are taken over
each drain: on 2 cores they show which process the throughput waits for.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.bench.burst import Graph, enqueue_backlog
from loadtest.bench.harness import DELIVERIES, fresh_storage, total, wait_for, workers
from loadtest.bench.measure import CpuMeter, profiled
from loadtest.bench.sizes import Sizes
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueues
from timeline.tools.azurite import Azurite

CONFIGURATIONS = {"1_account": (1, 1), "2_accounts": (2, 1), "2_workers": (1, 2)}
"""Name: (accounts, worker processes)."""
REQUESTS = "timeline_storage_requests_total"


@dataclass(frozen=True)
class Accounts:
    """Azurites with the graph seeded, kept for every run on that many accounts."""

    azurites: list[Azurite]
    storage: Storage
    followers: dict[str, int]


@dataclass(frozen=True)
class Run:
    eps: float
    cores: dict[str, float]
    """Cores busy on average during the drain, per role (see ``CpuMeter.cores``)."""
    cpu_ms_per_delivery: dict[str, float]
    requests_per_delivery: float


async def one_run(
    sizes: Sizes, accounts: Accounts, worker_count: int, label: str, profile: Path | None
) -> Run:
    async with workers(accounts.azurites, worker_count) as processes:
        lead_s = 2 + sizes.scaling_posts / 100
        _, expected = await enqueue_backlog(
            accounts.storage, accounts.followers, sizes.scaling_posts, lead_s, f"{label}: backlog"
        )
        pids = [p.pid for p in processes]
        meter = CpuMeter(
            {
                "worker": pids,
                "azurite": [_pid(a) for a in accounts.azurites],
                "bench": [os.getpid()],
            }
        )
        before, requests_before = await total(processes), await total(processes, REQUESTS)
        cpu_before = meter.sample()
        with profiled(pids, profile, label.removeprefix("scaling ").replace(" #", "-")):
            done = await wait_for(processes, DELIVERIES, before + expected, f"{label}: draining")
        cpu_after = meter.sample()
        deliveries = await total(processes) - before
        requests = await total(processes, REQUESTS) - requests_before
    work, _ = await FanoutQueues(accounts.storage).depth()
    if work:
        print(f"{label}: {work} messages left on the queue after the run", file=sys.stderr)
    cores = CpuMeter.cores(cpu_before, cpu_after)
    wall = cpu_after.at - cpu_before.at
    return Run(
        eps=deliveries / (done - cpu_before.at),
        cores=cores,
        cpu_ms_per_delivery={
            role: 1000 * cores[role] * wall / deliveries for role in ("worker", "azurite")
        },
        requests_per_delivery=requests / deliveries,
    )


def summary(runs: list[Run]) -> dict[str, Any]:
    """Every run's rate, and the means of the rest."""
    return {
        "eps_runs": [r.eps for r in runs],
        "cores": {role: statistics.mean(r.cores[role] for r in runs) for role in runs[0].cores},
        "cpu_ms_per_delivery": {
            role: statistics.mean(r.cpu_ms_per_delivery[role] for r in runs)
            for role in runs[0].cpu_ms_per_delivery
        },
        "requests_per_delivery": statistics.mean(r.requests_per_delivery for r in runs),
    }


async def scaling(sizes: Sizes, profile: Path | None = None) -> dict[str, Any]:
    graph = Graph(sizes.scaling_users, sizes.scaling_authors, sizes.scaling_followers)
    order = list(CONFIGURATIONS)
    runs: dict[str, list[Run]] = {name: [] for name in order}
    async with contextlib.AsyncExitStack() as stack:
        sets: dict[int, Accounts] = {}
        for count in sorted({accounts for accounts, _ in CONFIGURATIONS.values()}):
            azurites, storage = await stack.enter_async_context(fresh_storage(count))
            followers = await graph.seed_into(storage, f"scaling: seeding {count} account(s)")
            sets[count] = Accounts(azurites, storage, followers)
        for round_ in range(sizes.scaling_rounds):
            for name in order if round_ % 2 == 0 else order[::-1]:
                accounts, worker_count = CONFIGURATIONS[name]
                label = f"scaling {name} #{round_ + 1}"
                runs[name].append(
                    await one_run(sizes, sets[accounts], worker_count, label, profile)
                )
    result: dict[str, Any] = {}
    for name, done in runs.items():
        azurite = statistics.mean(r.cores["azurite"] for r in done)
        worker = statistics.mean(r.cores["worker"] for r in done)
        result[f"fanout_eps_{name}"] = statistics.mean(r.eps for r in done)
        result[f"azurite_cpu_share_{name}"] = azurite / max(azurite + worker, 1e-9)
    result["fanout_scaling"] = {name: summary(done) for name, done in runs.items()}
    return result


def _pid(azurite: Azurite) -> int:
    """The node process serving ``azurite`` (started by this process)."""
    if azurite.pid is None:
        raise RuntimeError("the Azurite is not running")
    return azurite.pid
