"""The stack under test: ``timeline run`` on free ports (embedded Azurite, API, one worker
with metrics), and the seeded graph."""

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


@contextlib.asynccontextmanager
async def stack(env: dict[str, str], base: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(  # noqa: ASYNC220 - starts our own stack, once
        [sys.executable, "-m", "timeline.cli", "run"], env=env, stderr=subprocess.DEVNULL
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


def roles(stack_pid: int) -> dict[str, list[int]]:
    """The stack's processes by role: ``api``, ``worker``, ``azurite`` (node)."""
    found: dict[str, list[int]] = {"api": [], "worker": [], "azurite": []}
    for child in psutil.Process(stack_pid).children(recursive=True):
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
