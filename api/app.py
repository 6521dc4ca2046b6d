"""The application factory: storage clients live in ``cleanup_ctx``, opened and closed once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from aiohttp import web

from api.docs import add_docs
from api.follows import FOLLOW_OPERATIONS
from api.keys import OPENAPI_KEY, SERVICE_KEY, SETTINGS_KEY, STORAGE_KEY
from api.lists import LIST_OPERATIONS
from api.middleware import MIDDLEWARES, echo_request_id
from api.openapi import build_openapi
from api.relations import RELATION_OPERATIONS
from api.routes import OPERATIONS as ROUTE_OPERATIONS
from api.stream import STREAMS_KEY, Streams
from api.web import add_web_client
from timeline.config import Settings
from timeline.model.tokens import KeyRing, TokenSigner
from timeline.reads.activity import Attendance
from timeline.reads.home import HomeTimeline
from timeline.service.operations import TimelineService
from timeline.service.outbox import Outbox
from timeline.storage.accounts import Storage
from timeline.storage.queue import FanoutQueues
from timeline.tables.activity import ActivityRepository
from timeline.tables.ratelimits import RateLimits
from timeline.tables.repositories import Repositories
from timeline.tables.secret import load_key_ring, wait_for_key_ring

API_VERSION = "1.0.0"
OPERATIONS = [*ROUTE_OPERATIONS, *FOLLOW_OPERATIONS, *RELATION_OPERATIONS, *LIST_OPERATIONS]
"""Every route: ``api.routes``' table and those of ``api.relations``."""


def openapi_document(page_size: int, max_post_chars: int) -> dict[str, Any]:
    """What ``GET /openapi.json`` serves."""
    return build_openapi(
        OPERATIONS,
        title="Timeline fan-out service",
        version=API_VERSION,
        page_size=page_size,
        max_post_chars=max_post_chars,
    )


def create_app(settings: Settings, connection_string: str) -> web.Application:
    app = web.Application(
        middlewares=MIDDLEWARES,
        client_max_size=settings.max_body_bytes,
    )
    app.on_response_prepare.append(echo_request_id)
    app[SETTINGS_KEY] = settings
    app[OPENAPI_KEY] = openapi_document(settings.page_size, settings.max_post_chars)
    for operation in OPERATIONS:
        operation.add_to(app)
    add_docs(app)
    add_web_client(app)
    app[STREAMS_KEY] = Streams(
        settings.max_streams, settings.max_streams_per_user, settings.stream_timing()
    )
    app.on_shutdown.append(app[STREAMS_KEY].stop)

    async def storage_ctx(app: web.Application) -> AsyncIterator[None]:
        async with Storage(connection_string, settings.storage_options()) as storage:
            app[STORAGE_KEY] = storage
            ring = await wait_for_key_ring(storage, settings.auth_secret)
            app[SERVICE_KEY] = _build_service(settings, storage, ring)
            yield
            await app[SERVICE_KEY].outbox.drain()  # releases still running, then close

    app.cleanup_ctx.append(storage_ctx)
    return app


def _build_service(settings: Settings, storage: Storage, ring: KeyRing) -> TimelineService:
    limits = RateLimits.per_minute(
        storage,
        posts=settings.posts_per_minute,
        writes=settings.writes_per_minute,
        registrations=settings.registrations_per_minute,
    )
    queue = FanoutQueues(storage)
    return TimelineService(
        Repositories.on(storage),
        queue,
        TokenSigner(ring, token_ttl_s=settings.token_ttl_s),
        page_size=settings.page_size,
        max_post_chars=settings.max_post_chars,
        limits=limits,
        home=HomeTimeline(
            storage,
            max_merged=settings.max_merged_authors,
            dormant_authors=settings.dormant_merge_authors,
            attendance=Attendance(
                ActivityRepository(storage),
                queue,
                settings.inactivity(),
                resend_after_s=2 * settings.fanout_timing().sweep_delay_s,
            ),
        ),
        timeline_cap=settings.max_timeline_items,
        credentials_cache_s=settings.credentials_cache_s,
        load_ring=partial(load_key_ring, storage, settings.auth_secret),
        idempotency_window_s=settings.idempotency_window_s,
        outbox=Outbox(
            queue,
            write_deadline_s=settings.api_write_deadline_s(),
            hidden_s=settings.hidden_message_s(),
        ),
        max_lists=settings.max_lists,
    )
