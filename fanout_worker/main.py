"""``fanout-worker``: run one fan-out worker (several may share one queue)."""

from __future__ import annotations

import sys

from prometheus_client import start_http_server

from fanout_worker.metrics import worker_registry
from fanout_worker.worker import Worker
from timeline.errors import ConfigurationError
from timeline.logs import configure_logging
from timeline.startup import load_settings


def main() -> None:
    settings = load_settings("fanout-worker")
    configure_logging(settings.log_format)
    if settings.worker_metrics_port is not None:
        start_http_server(
            settings.worker_metrics_port, addr=settings.host, registry=worker_registry()
        )
    try:
        Worker(settings, settings.connection_string()).run()
    except ConfigurationError as error:  # e.g. an account list the placement refuses
        sys.exit(f"fanout-worker: {error.message}")
