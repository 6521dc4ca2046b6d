"""Crash attribution: a message that kills every worker running it is quarantined within a
few minutes, with its reason, and the messages leased beside it are delivered.

The pill is a real worker process (``tests.pill_worker``) that exits when it starts one
author's post, restarted each time by this test as a supervisor would.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from tests.conftest import TEST_SECRET, eventually, make_settings, opened, program_env, unique
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import Followed, PostCreated
from timeline.storage.queue import FanoutQueue
from timeline.tools.azurite import Azurite

INNOCENTS = 40
VISIBILITY_S = 2


async def test_poison_pill_is_quarantined_and_its_company_delivered(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    pill = unique("pill")
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with opened(settings) as storage:
        queue = FanoutQueue(storage)
        await queue.send(PostCreated(author=pill, post_id=new_post_id(now_ticks())))
        for _ in range(INNOCENTS):  # old follows that never happened: each is simply done
            follower, subject = unique("f"), unique("s")
            await queue.send(Followed(follower=follower, subject=subject))
        deaths: list[int] = []

        async def settled() -> bool:
            return await queue.depth() == (0, 1)

        async with _supervised(private_azurite, tmp_path, pill, deaths):
            await eventually(settled, timeout_s=180, what="the pill quarantined, the rest done")
        poisoned = await queue.peek_poison()
    assert len(poisoned) == 1
    assert orjson.loads(poisoned[0].content)["author"] == pill
    assert poisoned[0].reason.startswith("crashed: ")
    assert "alone" in poisoned[0].reason
    assert len(deaths) >= 3, "the pill must have killed a worker each time it ran alone"


@contextlib.asynccontextmanager
async def _supervised(
    azurite: Azurite, workdir: Path, pill: str, deaths: list[int]
) -> AsyncIterator[None]:
    """One pill worker at a time, restarted whenever it dies."""
    env = program_env(
        storage_connection_string=azurite.connection_string,
        data_dir=workdir,
        auth_secret=TEST_SECRET,
        worker_idle_sleep_s=0.05,
        worker_idle_max_sleep_s=0.05,
        worker_visibility_timeout_s=VISIBILITY_S,
        worker_shutdown_grace_s=2,
    ) | {"PILL_AUTHOR": pill}
    stopping = asyncio.Event()
    current: list[asyncio.subprocess.Process] = []

    async def supervise() -> None:
        with (workdir / "pill-worker.log").open("ab") as sink:
            while not stopping.is_set():
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "tests.pill_worker", env=env, stdout=sink, stderr=sink
                )
                current[:] = [process]
                code = await process.wait()
                if not stopping.is_set():
                    deaths.append(code)

    task = asyncio.create_task(supervise())
    try:
        yield
    finally:
        stopping.set()
        for process in current:
            if process.returncode is None:
                process.terminate()
        await asyncio.wait_for(task, 30)
