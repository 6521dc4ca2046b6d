"""``fanout-worker``: run one fan-out worker (several may share one queue)."""

from __future__ import annotations

import logging

from fanout_worker.worker import Worker
from timeline.config import Settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings()
    Worker(settings, settings.connection_string()).run()
