"""What aiohttp's access log costs the API process per request: ``GET /healthz`` (no storage
call, so the server's own work is all there is) with ``TIMELINE_ACCESS_LOG`` on and off,
CPU of the API process per request (``time.process_time`` of another process: psutil).

``python -m loadtest.bench.access_log`` prints one JSON line."""

from __future__ import annotations

import asyncio
import json
from functools import partial

from loadtest.bench.api import ApiProcess, api_process, cost
from loadtest.bench.harness import fresh_storage

REQUESTS = 3000


async def _healthz(server: ApiProcess) -> None:
    async with server.session.get(f"{server.base}/healthz") as response:
        assert response.status == 200


async def access_log_costs() -> dict[str, float]:
    """Each setting twice, interleaved (the machine's load drifts); the lower of each."""
    found: dict[str, list[float]] = {"true": [], "false": []}
    async with fresh_storage() as (azurites, _storage):
        for _ in range(2):
            for setting in found:
                async with api_process(azurites, TIMELINE_ACCESS_LOG=setting) as server:
                    calls = [partial(_healthz, server)] * REQUESTS
                    await cost(server, calls[: REQUESTS // 10], f"access log {setting}: warm-up")
                    found[setting].append((await cost(server, calls, f"access log {setting}"))[0])
    return {
        "api_cpu_ms_per_healthz": min(found["true"]),
        "api_cpu_ms_per_healthz_no_access_log": min(found["false"]),
    }


if __name__ == "__main__":
    print(json.dumps({k: round(v, 4) for k, v in asyncio.run(access_log_costs()).items()}))
