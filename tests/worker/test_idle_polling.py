"""Idle receivers back off: few receives while the queues stay empty, the first message
after a quiet spell leased within the longest rest, a burst wakes every receiver and a
single message does not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from fanout_worker.idle import JITTER, IdlePace
from fanout_worker.worker import Worker
from tests.conftest import eventually, make_settings, opened, running_worker
from timeline.model.priority import Priority
from timeline.storage.queue import FanoutQueue
from timeline.tools.azurite import Azurite

BASE_S = 0.05
CAP_S = 0.4
RECEIVERS = 4
LOOKOUTS = 2
"""One receiver of each priority keeps polling once the others wait for work."""
WARM_UP = 5 * RECEIVERS
"""Empty receives (one shard: one a round) after which every receiver's rest reached the cap:
the others stop after 4 rounds (0.05, 0.1, 0.2, then 0.4 s)."""


@dataclass
class Idle:
    worker: Worker
    queue: FanoutQueue


@pytest.fixture
async def idle(private_azurite: Azurite, tmp_path: Path) -> AsyncIterator[Idle]:
    """A worker over one empty shard, its rest doubling from 0.05 up to 0.4 s, warmed up."""
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        worker_receivers=RECEIVERS,
        worker_idle_sleep_s=BASE_S,
        worker_idle_max_sleep_s=CAP_S,
    )
    async with opened(settings) as storage, running_worker(settings) as worker:
        await until(lambda: worker.polls.empty >= WARM_UP, "the receivers to back off")
        yield Idle(worker, FanoutQueue(storage))


async def until(check: Callable[[], bool], what: str) -> None:
    async def holds() -> bool:
        return check()

    await eventually(holds, timeout_s=30, what=what)


async def test_idle_receives_fall_to_the_lookouts_per_longest_rest(idle: Idle) -> None:
    polls = idle.worker.polls
    start, started = polls.empty, time.monotonic()
    await until(lambda: polls.empty >= start + 10, "ten more empty receives")
    rate = (polls.empty - start) / (time.monotonic() - started)
    # without back-off it is 4 / 0.05 = 80 a second; every receiver polling at the cap, 11
    assert rate <= 1.15 * LOOKOUTS / ((1 - JITTER) * CAP_S), rate
    assert polls.leased == 0


@pytest.mark.parametrize("level", [Priority.HIGH, Priority.LOW])
async def test_a_message_after_a_long_idle_is_leased_within_the_longest_rest(
    idle: Idle, level: Priority
) -> None:
    polls = idle.worker.polls
    await until(lambda: polls.empty >= 2 * WARM_UP, "a long idle")
    sent = time.monotonic()
    await idle.queue.send_raw("not a fan-out message", level=level)
    woken = polls.woken
    await until(lambda: polls.leased >= 1, "the message to be leased")
    waited = time.monotonic() - sent
    assert waited <= CAP_S + 0.5, waited  # the longest rest, one receive, and slack
    assert polls.woken == woken  # one message: the lane is drained, the others rest on


async def test_a_burst_wakes_every_receiver(idle: Idle) -> None:
    polls = idle.worker.polls
    woken = polls.woken
    await asyncio.gather(*(idle.queue.send_raw(f"burst {i}") for i in range(40)))
    await until(lambda: polls.leased >= 1, "the burst to be leased")
    # the two that had stopped polling must be woken (the other lookout, too, if it rested)
    await until(lambda: polls.woken >= woken + RECEIVERS - LOOKOUTS, "every receiver to wake")


def test_rests_double_from_the_idle_sleep_up_to_the_max() -> None:
    pace = IdlePace(0.5, 3.0, asyncio.Event())
    assert [pace.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [pace.parks(n, lookout=False) for n in (2, 3, 4)] == [False, False, True]
    assert not pace.parks(40, lookout=True)
    same = IdlePace(0.5, 0.5, asyncio.Event())  # no back-off: every receiver keeps polling
    assert same.delay(9) == 0.5
    assert not same.parks(9, lookout=False)
    assert IdlePace(0.5, 0.1, asyncio.Event()).cap == 0.5
