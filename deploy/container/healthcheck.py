"""The image's health check: the API's ``/readyz``, or a worker's metrics endpoint.

Which one: the argument (``api`` or ``worker``), else the container's main process (PID 1):
``fanout-worker`` or not. Exit status 0 is healthy, 1 is not (``HEALTHCHECK``'s contract)."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path


def target(program: str | None) -> str:
    """The URL to probe, for the program this container runs."""
    if program is None:
        program = Path("/proc/1/cmdline").read_bytes().replace(b"\0", b" ").decode()
    if "worker" in program:
        return f"http://127.0.0.1:{os.environ.get('TIMELINE_WORKER_METRICS_PORT', '9102')}/metrics"
    return f"http://127.0.0.1:{os.environ.get('TIMELINE_PORT', '8080')}/readyz"


def main() -> int:
    url = target(sys.argv[1] if len(sys.argv) > 1 else None)
    try:
        with urllib.request.urlopen(url, timeout=4) as response:  # noqa: S310 - loopback
            return 0 if response.status == 200 else 1
    except OSError as error:
        print(f"unhealthy: {url}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
