"""``timeline-api``: serve the REST API."""

from __future__ import annotations

from aiohttp import web

from api.app import create_app
from timeline.config import Settings
from timeline.logs import configure_logging


def main() -> None:
    configure_logging()
    settings = Settings()
    app = create_app(settings, settings.connection_string())
    web.run_app(app, host=settings.host, port=settings.port, print=None)
