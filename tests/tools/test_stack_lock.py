"""The stack lock covers the whole stack: a closed terminal (SIGHUP) stops every child, and
the children of a killed supervisor (SIGKILL) keep their data folder locked."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest

from tests.conftest import eventually, program_env
from tests.tools.stack_helpers import StackProcess, ready, start_until_ready
from timeline.tools.azurite import free_ports
from timeline.tools.lock import STACK_LOCK


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_cli(*args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - this interpreter, a fixed module
        [sys.executable, "-m", "timeline.tools.cli", *args],
        env=program_env(**settings), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def children(data_dir: Path) -> list[int]:
    """The pids ``timeline run`` recorded for its Azurite, APIs and workers (none: [])."""
    lines = (data_dir / STACK_LOCK).read_text().splitlines()
    return [int(pid) for pid in lines[1].split()] if len(lines) > 1 else []


async def stop_all(process: asyncio.subprocess.Process | None, pids: list[int]) -> None:
    """End the supervisor, and any children it left, whatever the test did (the children
    first: while one holds the log pipe, waiting for a piped supervisor never ends)."""
    for pid in ([process.pid] if process is not None else []) + pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

    async def gone() -> bool:
        return not any(alive(pid) for pid in pids)

    await eventually(gone, timeout_s=30, what="the children to exit")
    if process is not None:
        await asyncio.wait_for(process.wait(), 30)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
async def test_a_closed_terminal_stops_every_child(tmp_path: Path) -> None:
    port, *azurite_ports = free_ports(4)
    stack = StackProcess(tmp_path / "data", port, tuple(azurite_ports))
    process, _, log = await start_until_ready(stack)
    pids = [child.pid for child in psutil.Process(process.pid).children()]
    try:
        assert len(pids) == 3  # Azurite, API, worker
        process.send_signal(signal.SIGHUP)

        async def stopped() -> bool:
            return not any(alive(pid) for pid in pids)

        await eventually(stopped, timeout_s=30, what="every child to stop on SIGHUP")
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        await stop_all(process, pids)
        log.cancel()


async def test_the_children_of_a_killed_stack_keep_its_folder_locked(tmp_path: Path) -> None:
    port, other_port, *azurite_ports = free_ports(8)
    data = tmp_path / "data"
    stack = StackProcess(data, port, tuple(azurite_ports[:3]))
    stack.start()  # not piped: the orphans would hold the pipe open
    assert stack.process is not None
    pids: list[int] = []
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: ready(session, stack.base), timeout_s=60, what="the stack")
        pids = [child.pid for child in psutil.Process(stack.process.pid).children()]
        assert sorted(children(data)) == sorted(pids)  # recorded for the message below
        stack.process.kill()
        stack.process.wait()
        assert all(alive(pid) for pid in pids)  # the children outlive their supervisor
        # Other ports: only the lock can keep a second Azurite off the same folder.
        second = await asyncio.to_thread(
            run_cli, "run", data_dir=data, port=other_port,
            azurite_ports=",".join(map(str, azurite_ports[3:6])),
        )  # fmt: skip
        listed = " ".join(map(str, pids))
        assert second.returncode == 2, second.stderr
        assert second.stderr.splitlines() == [
            f"timeline: the processes of a stack whose supervisor (pid {stack.process.pid}) "
            f"was killed still run in {data} (pids {listed}): stop them with `kill {listed}`, "
            "or give this one another folder with TIMELINE_DATA_DIR"
        ]
    finally:
        if stack.process.poll() is None:
            stack.stop()
        await stop_all(None, pids)


def test_a_data_folder_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    done = run_cli("run", data_dir=tmp_path / "file" / "data", port=free_ports(1)[0])
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"timeline: cannot write the stack's lock in {tmp_path / 'file' / 'data'} (Not a "
        "directory): give the stack a writable folder with TIMELINE_DATA_DIR"
    ]
