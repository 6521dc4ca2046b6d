"""The sweep's budget: each account and each group (rows filed by creation, rows filed by
due time) has its own per round, so a steady inflow of claims never starves the rate-limit
windows and idempotency keys (or a later account) behind them."""

from __future__ import annotations

import time

import pytest

from fanout_worker import sweeper as sweeper_module
from fanout_worker.sweeper import GRACE_S, Sweeper
from tests.conftest import unique
from timeline.metrics import FANOUT
from timeline.model.keys import now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import RATE_LIMITS
from timeline.tables.follows import request_id
from timeline.tables.ratelimits import TableWindowStorage, partition_of
from timeline.tables.repositories import Repositories
from timeline.tables.rows import get_entity

LIFETIME_S = 3600.0
CAP = 10
LATER = LIFETIME_S + GRACE_S + 120


async def test_a_steady_claim_load_does_not_starve_due_windows(
    own: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweeper_module, "MAX_ROWS", CAP)
    repos = Repositories.on(own)
    key = unique("k")
    await TableWindowStorage(own).incr(key, 60)  # one window, due a minute from now
    sweep = Sweeper(own, claim_lifetime_s=LIFETIME_S)
    for _ in range(CAP):  # a round's inflow of claims, as many as the round's cap
        await repos.follows.claim(unique("s"), request_id(unique("f"), now_ticks()))
    await sweep.sweep(now=time.time() + LATER)
    assert await get_entity(own, RATE_LIMITS, partition_of(key), "window") is None


async def test_the_oldest_due_index_row_s_age_is_measured(own: Storage) -> None:
    repos = Repositories.on(own)
    await repos.follows.claim(unique("s"), request_id(unique("f"), now_ticks()))
    late_by = 600.0
    await Sweeper(own, claim_lifetime_s=LIFETIME_S).sweep(now=time.time() + LATER + late_by)
    age = FANOUT.get_sample_value("fanout_expiry_oldest_due_seconds", {"group": "c"})
    assert age is not None
    assert late_by <= age <= late_by + LATER - LIFETIME_S + 120
