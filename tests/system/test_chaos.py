"""The chaos test: random workload, random SIGKILLs or storage freezes, exact end state.

``make test`` runs one seed of ``kill`` for 12 s; ``make test-long`` one seed of each variant;
``make chaos SEEDS=N`` runs N seeds of each, longer (``CHAOS_DURATION_S``), printing one JSON
line per run.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from tests import chaos


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        seeds = int(os.environ.get("CHAOS_SEEDS", "1"))
        first = int(os.environ.get("CHAOS_FIRST_SEED", "1"))
        metafunc.parametrize("seed", range(first, first + seeds))


LONG = pytest.mark.long


@pytest.mark.timeout(600 + 6 * float(os.environ.get("CHAOS_DURATION_S", "12")))
@pytest.mark.parametrize(
    "variant",
    ["kill", pytest.param("pause", marks=LONG), pytest.param("rebalance", marks=LONG),
     pytest.param("crashloop", marks=LONG), pytest.param("apikill", marks=LONG)],
)  # fmt: skip
async def test_chaos(seed: int, variant: str, tmp_path: Path) -> None:
    duration = float(os.environ.get("CHAOS_DURATION_S", "12"))
    report = await chaos.run(seed, variant, duration, tmp_path)
    print(orjson.dumps(report.line()).decode())
    assert report.kills + report.pauses > 0, "nothing was broken: the run proves nothing"
    assert report.pauses > 0 or variant != "pause", "storage was never frozen"
    assert report.live_posts > 0
    assert report.timeline_rows > report.live_posts, "no fan-out happened"
    assert report.rebalanced == (variant == "rebalance")
    assert report.reads["dormant"] > 0, "no reader was read while dormant"
    assert report.reads["waking"] > 0, "no reader was read while its wake ran"
    assert report.requests["repost"] > 0, "no repost was made"  # entries: repost_rows
    # (not required: dedupe, dormancy, undos, deletes and unfollows may leave none at the end)
    assert report.requests["block"] > 0, "no block was made"
    assert report.requests["mute"] > 0, "no mute was made"
    assert report.requests["lock"] > 0, "no account was locked"
    assert report.requests["filter"] > 0, "no keyword filter was made"
    assert report.requests["list"] > 0, "no list was made"
    assert report.requests["list_member"] > 0, "no member was added to a list"
    assert report.requests["delete_account"] == 1, "no account was deleted"
    assert report.private_on_pages > 0, "no author's page showed a followers-only post"
