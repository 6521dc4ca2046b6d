"""The sweep's budget: each account and each group (rows filed by due time, readers'
dormancy checks) has its own per round, so a steady inflow of dormancy checks never starves
the rate-limit windows and idempotency keys (or a later account) behind them."""

from __future__ import annotations

import time

import pytest

from fanout_worker import sweeper as sweeper_module
from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import unique
from timeline.delivery.dormancy import Dormancy
from timeline.metrics import FANOUT
from timeline.storage.accounts import Storage
from timeline.storage.names import RATE_LIMITS
from timeline.tables.activity import ActivityRepository, Inactivity
from timeline.tables.ratelimits import TableWindowStorage, partition_of
from timeline.tables.rows import get_entity

CAP = 10
LATER = GRACE_S + 120
INACTIVITY = Inactivity(8.0)


async def test_a_steady_load_of_dormancy_checks_does_not_starve_due_windows(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweeper_module, "MAX_ROWS", CAP)
    key = unique("k")
    await TableWindowStorage(own).incr(key, 60)  # one window, due a minute from now
    activity = ActivityRepository(own)
    now = time.time()
    for _ in range(CAP):  # a round's inflow of checks, as many as the round's cap
        await activity.file_check(unique("r"), now)
    sweep = Sweeper(own, dormancy=Dormancy(own, INACTIVITY, flag_window_s=60))
    await sweep.sweep(now=now + 60 + LATER)
    assert await get_entity(own, RATE_LIMITS, partition_of(key), "window") is None


async def test_the_oldest_due_index_row_s_age_is_measured(own: Storage) -> None:
    await TableWindowStorage(own).incr(unique("k"), 60)  # due a minute from now
    late_by = 600.0
    await Sweeper(own).sweep(now=time.time() + 60 + GRACE_S + late_by)
    age = FANOUT.get_sample_value("fanout_expiry_oldest_due_seconds", {"group": "d"})
    assert age is not None
    assert late_by <= age <= late_by + 60 + GRACE_S + 120
