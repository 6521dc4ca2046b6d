"""``fanout-worker``: run one fan-out worker (several may share one queue)."""

from __future__ import annotations

from fanout_worker.worker import Worker
from timeline.config import Settings
from timeline.logs import configure_logging


def main() -> None:
    configure_logging()
    settings = Settings()
    Worker(settings, settings.connection_string()).run()
