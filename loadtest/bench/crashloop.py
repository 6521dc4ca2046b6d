"""Crash loop: workers SIGKILLed about once a second under the mixed workload; how many
messages were poisoned for it (goal 0). Reuses the chaos harness (``tests.chaos``), which
already runs the real processes and checks the end state exactly."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from loadtest.bench.sizes import Sizes
from tests import chaos


async def crashloop(sizes: Sizes) -> dict[str, Any]:
    report = chaos.Report(seed=1, variant="crashloop")
    failure = None
    with tempfile.TemporaryDirectory(prefix="bench-crashloop-") as workdir:
        try:
            await chaos.run(1, "crashloop", sizes.crashloop_seconds, Path(workdir), report=report)
        except AssertionError as error:  # reported, not raised: the key says how bad
            failure = str(error)[:300]
    return {
        "crashloop_poisoned": report.poisoned,
        "crashloop_kills": report.kills,
        "crashloop_failure": failure,
    }
