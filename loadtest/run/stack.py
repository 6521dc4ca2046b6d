"""The stack under test: ``timeline run`` on free ports (API, one worker with metrics) on an
in-memory Azurite of the run's own, and the seeded graph.

Azurite runs in memory (``--inMemoryPersistence``), as in ``make bench``: with files (what
``timeline run``'s embedded Azurite uses) LokiJS saves its whole database every 5 s, on
Node's one thread, and every request in flight waits for the save; that beat was the read
tail of earlier runs (see loadtest/README.md), and Azure has nothing like it.
``--azurite-disk`` brings the embedded, file-backed Azurite back, to compare."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil

from timeline.tools.azurite import Azurite


@contextlib.asynccontextmanager
async def storage(env: dict[str, str], *, disk: bool) -> AsyncIterator[dict[str, str]]:
    """``env`` for the stack: with an in-memory Azurite of our own as its configured storage,
    or (``disk``) unchanged, so ``timeline run`` starts its embedded, file-backed one."""
    if disk:
        yield env
        return
    azurite = Azurite(location=None)
    try:
        await asyncio.to_thread(azurite.start)
        yield env | {"TIMELINE_STORAGE_CONNECTION_STRINGS": azurite.connection_string}
    finally:
        await asyncio.to_thread(azurite.stop)


@contextlib.asynccontextmanager
async def stack(env: dict[str, str], base: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(  # noqa: ASYNC220 - starts our own stack, once
        [sys.executable, "-m", "timeline.tools.cli", "run"], env=env, stderr=subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 90
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{base}/readyz") as response:
                        if response.status == 200:
                            break
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the stack did not become ready")
                await asyncio.sleep(0.2)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 60)


async def seed(env: dict[str, str], users: int, tokens: Path) -> None:
    """``python -m loadtest.seed`` against the running stack (tokens and hybrid.json)."""
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "loadtest.seed", "--users", str(users), "--tokens", str(tokens)],
        env=env,
        check=True,
    )


def roles() -> dict[str, list[int]]:
    """The stack's processes by role: ``api``, ``worker``, ``azurite`` (node), among this
    process's descendants (the Azurite is ours, or the stack's child with ``--azurite-disk``)."""
    found: dict[str, list[int]] = {"api": [], "worker": [], "azurite": []}
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            command = child.cmdline()
            if command[1:3] == ["-m", "api"]:
                found["api"].append(child.pid)
            elif command[1:3] == ["-m", "fanout_worker"]:
                found["worker"].append(child.pid)
            elif any("azurite" in part for part in command):
                found["azurite"].append(child.pid)
    if not all(found.values()):
        raise RuntimeError(f"the stack's processes were not all found: {found}")
    return found
