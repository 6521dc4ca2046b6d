"""``timeline-api``: serve the REST API."""

from __future__ import annotations

import logging

from aiohttp import web

from api.app import create_app
from timeline.config import Settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = Settings()
    app = create_app(settings, settings.connection_string())
    web.run_app(app, host=settings.host, port=settings.port, print=None)
