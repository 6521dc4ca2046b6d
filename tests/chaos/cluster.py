"""The fault injection: the processes under test, and SIGKILLs, storage freezes and a
rebalance killed midway."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
from collections import Counter
from pathlib import Path

from tests.chaos.report import Report
from tests.conftest import TEST_SECRET, program_env
from timeline.tools.azurite import Azurite, free_ports

STORAGE_TIMEOUT_S = 2.0
WRITE_DEADLINE_S = 2.0
SWEEP_DELAY_S = 12.0
"""Past the write deadline plus one storage call by ``STALL_S``: a copy justified by a read
lands before the second pass of a delete or unfollow that began after that read, as
docs/guarantees.md requires of storage ("Not covered": a request run later than that)."""
LONGEST_FREEZE_S = 3.5
STALL_S = SWEEP_DELAY_S - WRITE_DEADLINE_S - STORAGE_TIMEOUT_S
"""How late storage may run a request the client has given up on: a freeze, and Azurite's
catch-up after it on a loaded machine, with room. Freezes are at least this far apart, so
two never add up within one such window (two 3.5 s freezes 0.5 s apart, and the catch-up,
once left a copy landing after an unfollow's second pass)."""
VISIBILITY_S = 3
PLACEMENT_LEASE_S = 1.0
REBALANCE_MARGIN_S = 0.2
"""The fence is the lease plus one storage call plus this."""
HYBRID_THRESHOLD = 5
"""Of 7 possible followers (about half follow under this load): up at 5, down at 2 or fewer."""
MAX_MERGED = 2
"""So readers who follow several large authors get some as copies (overflow)."""
INACTIVE_S = 3.0
"""The inactive period: stamps of 0.375 s, so readers go dormant and return within a run."""
EXPIRY_SWEEP_S = 1.0
TIMELINE_CAP = 800
VARIANTS = {
    "kill": (2, 2),
    "pause": (1, 1),
    "rebalance": (3, 2),
    "crashloop": (2, 2),
    "apikill": (2, 2),
}
"""Each variant's accounts, and how many of them the placement starts on."""
CRASHLOOP_WORKERS = 2
API_KILL_CHANCE = 0.02
"""In ``apikill``: the chance the API kills itself between a write and its message's release
(``tests/chaos/faulty_api.py``); the harness starts it again."""
HIDDEN_MESSAGE_S = 13
"""Past the API write deadline (5 storage timeouts) plus one storage call, with 1 s of
margin."""


REBALANCE_TRIES = 3
"""Runs of the resumable rebalance after the killed one: a run that met storage timeouts on
this shared machine stops with "try again shortly", and resumes from the placement row."""


class Cluster:
    """The processes under test, their logs, and how to break them."""

    def __init__(self, workdir: Path, workers: int, accounts: int = 1, initial: int = 1) -> None:
        self.workdir = workdir
        self.azurites = [Azurite(location=None) for _ in range(accounts)]
        self.azurite = self.azurites[0]
        self.initial = initial
        """Accounts the placement starts on; the others wait for a rebalance."""
        self.port = free_ports(1)[0]
        self.api: asyncio.subprocess.Process | None = None
        self.workers: list[asyncio.subprocess.Process] = []
        self._worker_count = workers
        self._spawned = 0
        self.api_kill_chance = 0.0

    @property
    def connection_strings(self) -> str:
        return "\n".join(server.connection_string for server in self.azurites)

    def env(self, accounts: int | None = None, *, fault: float = 0.0) -> dict[str, str]:
        serving = self.azurites[: accounts or len(self.azurites)]
        return {"CHAOS_API_KILL_CHANCE": str(fault)} | program_env(
            api_hidden_message_s=HIDDEN_MESSAGE_S,
            storage_connection_strings=" ".join(server.connection_string for server in serving),
            placement_lease_s=PLACEMENT_LEASE_S,
            rebalance_margin_s=REBALANCE_MARGIN_S,
            data_dir=self.workdir,
            auth_secret=TEST_SECRET,
            port=self.port,
            posts_per_minute=0,
            writes_per_minute=0,
            registrations_per_minute=0,
            storage_timeout_s=STORAGE_TIMEOUT_S,
            storage_retries=1,
            worker_idle_sleep_s=0.05,
            worker_visibility_timeout_s=VISIBILITY_S,
            worker_shutdown_grace_s=2,
            worker_write_deadline_s=WRITE_DEADLINE_S,
            worker_sweep_delay_s=SWEEP_DELAY_S,
            worker_retry_base_s=0.1,
            worker_retry_cap_s=2,
            fanout_on_read_followers=HYBRID_THRESHOLD,
            max_merged_authors=MAX_MERGED,
            inactive_days=INACTIVE_S / 86_400,
            max_timeline_items=TIMELINE_CAP,
            expiry_sweep_interval_s=EXPIRY_SWEEP_S,
        )

    async def start(self) -> None:
        for server in self.azurites:
            await asyncio.to_thread(server.start)
        init = await self._spawn("timeline.tools.cli", "init.log", "init", accounts=self.initial)
        assert await init.wait() == 0, (self.workdir / "init.log").read_text()
        self.api = await self._spawn_api()
        self.workers = [await self._spawn_worker() for _ in range(self._worker_count)]

    def regrades(self) -> Counter[str]:
        """Authors settled as merged or copied, from the workers' logs."""
        settled: Counter[str] = Counter()
        for log in self.workdir.glob("worker-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if " is now " in line:
                    settled[line.rsplit(" ", 1)[-1]] += 1
        return settled

    async def _spawn_api(self) -> asyncio.subprocess.Process:
        if self.api_kill_chance:
            return await self._spawn(
                "tests.chaos.faulty_api", "api.log", fault=self.api_kill_chance
            )
        return await self._spawn("api", "api.log")

    async def _spawn_worker(self) -> asyncio.subprocess.Process:
        self._spawned += 1
        return await self._spawn("fanout_worker", f"worker-{self._spawned}.log")

    async def _spawn(
        self, module: str, log: str, *args: str, accounts: int | None = None, fault: float = 0.0
    ) -> asyncio.subprocess.Process:
        with (self.workdir / log).open("ab") as sink:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                env=self.env(accounts, fault=fault),
                stdout=sink,
                stderr=sink,
            )

    async def rebalance(self, rng: random.Random, report: Report) -> None:
        """Add the accounts past ``initial``: one rebalance SIGKILLed midway, then one to
        the end (it resumes from the placement row)."""
        first = await self._spawn(
            "timeline.tools.cli", "rebalance.log", "rebalance", "--steps", "2"
        )
        await asyncio.sleep(rng.uniform(1.0, 2 * (PLACEMENT_LEASE_S + STORAGE_TIMEOUT_S)))
        if first.returncode is None:
            report.kills += 1
            first.kill()
        await first.wait()
        for _ in range(REBALANCE_TRIES):  # "storage is unavailable, try again": as an operator
            second = await self._spawn(
                "timeline.tools.cli", "rebalance.log", "rebalance", "--steps", "2"
            )
            code = await second.wait()
            if code == 0:
                break
        assert code == 0, (self.workdir / "rebalance.log").read_text()
        report.rebalanced = True

    async def kill_a_worker(self, rng: random.Random) -> None:
        """SIGKILL one worker (no goodbye) and start a fresh one in its place."""
        index = rng.randrange(len(self.workers))
        victim = self.workers[index]
        with contextlib.suppress(ProcessLookupError):
            victim.kill()
        await victim.wait()
        self.workers[index] = await self._spawn_worker()

    async def restart_api_if_dead(self) -> bool:
        """Start the API again if it killed itself (``apikill``); True if it had."""
        if self.api is None or self.api.returncode is None:
            return False
        self.api = await self._spawn_api()
        return True

    async def calm_api(self) -> None:
        """An API without the fault for the checks after the load: started afresh."""
        if self.api is not None and self.api.returncode is None:
            self.api.send_signal(signal.SIGTERM)
            await self.api.wait()
        self.api_kill_chance = 0.0
        self.api = await self._spawn("api", "api.log")

    async def pause_storage(self, seconds: float) -> None:
        """Freeze Azurite: calls hang, then time out; what was sent lands when it thaws."""
        self.azurite.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.azurite.signal(signal.SIGCONT)

    async def stop(self) -> None:
        for process in [*self.workers, *([self.api] if self.api else [])]:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers, *([self.api] if self.api else [])]:
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
        for server in self.azurites:
            await asyncio.to_thread(server.stop)

    def crashed(self) -> list[str]:
        """Processes that died on their own (not killed by the harness)."""
        alive = [("api", self.api)] + [("worker", w) for w in self.workers]
        return [name for name, process in alive if process and process.returncode is not None]


async def break_things(
    cluster: Cluster, rng: random.Random, report: Report, variant: str, until: float
) -> None:
    loop = asyncio.get_running_loop()
    if variant == "apikill":
        while loop.time() < until:
            await asyncio.sleep(0.2)
            if await cluster.restart_api_if_dead():
                report.kills += 1
        await cluster.calm_api()
        return
    interval = (0.5, 1.5) if variant == "crashloop" else (0.5, 2.5)
    thawed = -STALL_S
    while loop.time() < until - 1:
        await asyncio.sleep(rng.uniform(*interval))
        now = loop.time()
        spaced = now >= thawed + STALL_S  # else this freeze could add to the last one
        if variant == "pause" and spaced and now < until - 1 and rng.random() < 0.5:
            report.pauses += 1
            await cluster.pause_storage(rng.uniform(1.0, LONGEST_FREEZE_S))
            thawed = loop.time()
        else:
            report.kills += 1
            await cluster.kill_a_worker(rng)
