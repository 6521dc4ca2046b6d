"""Typed application keys shared by the app factory and the handlers."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from timeline.config import Settings
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage

SETTINGS_KEY = web.AppKey("settings", Settings)
STORAGE_KEY = web.AppKey("storage", Storage)
SERVICE_KEY = web.AppKey("service", TimelineService)
OPENAPI_KEY = web.AppKey("openapi", dict[str, Any])
