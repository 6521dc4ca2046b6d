"""``GET /users/{id}/timeline/stream``: a home timeline as Server-Sent Events.

Each event is one timeline entry (``event: post``, ``data:`` the post as JSON) with its
position as the ``id:``, so a client that reconnects sends ``Last-Event-ID`` and resumes
where it left off (``timeline.reads.live`` says why it may see a few entries again), or a
removal (``event: delete``, ``data: {"post_id": ...}``: a delete or an unfollow's purge). A comment
line goes out when nothing else has for the heartbeat interval, so proxies keep the
connection and a dead client is noticed. A process serves at most ``TIMELINE_MAX_STREAMS``
streams (503 beyond), and ``TIMELINE_MAX_STREAMS_PER_USER`` of one user (429 beyond), so
one user cannot take them all. A stream ends when its bearer token expires or, within
``TIMELINE_STREAM_TOKEN_RECHECK_S``, is revoked (the client's reconnect then gets the 401),
and all of them end when the process shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterator

import orjson
from aiohttp import web

from timeline.errors import (
    AuthenticationError,
    OverloadedError,
    RateLimitedError,
    RetryableError,
)
from timeline.reads.live import Removal, StreamTiming, Update
from timeline.service.operations import TimelineService

RETRY_MS = 2000
"""What a client waits before it reconnects (the SSE ``retry:`` field)."""


class Streams:
    """The live streams of this process: how many may run, and the signal to end them."""

    def __init__(self, capacity: int, per_user: int, timing: StreamTiming) -> None:
        self.capacity = capacity
        self.per_user = per_user
        self.timing = timing
        self.open = 0
        self.by_user: Counter[str] = Counter()
        self.stopping = asyncio.Event()

    @contextlib.contextmanager
    def slot(self, user: str) -> Iterator[None]:
        if self.open >= self.capacity or self.stopping.is_set():
            raise OverloadedError(
                f"this process already serves {self.open} live streams; try again later "
                "or read the timeline with 'since'",
                retry_after=5,
            )
        if self.by_user[user] >= self.per_user:
            raise RateLimitedError(
                f"{user!r} already has {self.by_user[user]} live streams open here",
                retry_after=5,
                code="too_many_streams",
            )
        self.open += 1
        self.by_user[user] += 1
        try:
            yield
        finally:
            self.open -= 1
            self.by_user[user] -= 1
            if not self.by_user[user]:
                del self.by_user[user]

    async def stop(self, _app: web.Application) -> None:
        """``on_shutdown``: end every stream, so shutdown does not wait for clients."""
        self.stopping.set()


STREAMS_KEY = web.AppKey("streams", Streams)


async def serve(
    request: web.Request, service: TimelineService, token: str, owner: str
) -> web.StreamResponse:
    """Check everything before the 200, then send entries as they land, until the token
    expires, the client leaves or the process stops."""
    streams = request.app[STREAMS_KEY]
    actor = await service.accounts.authenticate(token)
    resume = request.headers.get("Last-Event-ID")
    since, name = (resume, "Last-Event-ID") if resume else (request.query.get("since"), "since")
    with streams.slot(actor):
        watch = await service.timelines.watch(
            actor, owner, since, lookback_s=streams.timing.lookback_s, since_name=name
        )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        lasts = service.accounts.token_expiry(token) - time.time()
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            await response.prepare(request)  # the client may have left during the set-up
            await response.write(f"retry: {RETRY_MS}\n\n".encode())
            async with asyncio.timeout(lasts):
                checked = time.monotonic()
                async for fresh in watch.updates(streams.timing, streams.stopping):
                    if time.monotonic() - checked >= streams.timing.token_recheck_s:
                        if not await _still_valid(service, token):
                            break
                        checked = time.monotonic()
                    await response.write(_events(service, owner, fresh))
                    if request.transport is None or request.transport.is_closing():
                        break
        return response


async def _still_valid(service: TimelineService, token: str) -> bool:
    """False once the token is revoked; a storage outage keeps the stream (checked later)."""
    try:
        await service.accounts.authenticate(token)
    except AuthenticationError:
        return False
    except RetryableError:
        return True
    return True


def _events(service: TimelineService, owner: str, updates: list[Update]) -> bytes:
    """The SSE frames of ``updates``, or a heartbeat comment when there are none. A removal
    is ``event: delete`` with ``{"post_id"}`` and no ``id:`` (it is no position: a client
    resumes from its newest post event)."""
    if not updates:
        return b": heartbeat\n\n"
    return b"".join(_event(service, owner, update) for update in updates)


def _event(service: TimelineService, owner: str, update: Update) -> bytes:
    if isinstance(update, Removal):
        return b"event: delete\ndata: %s\n\n" % orjson.dumps({"post_id": update.post_id})
    return b"event: post\nid: %s\ndata: %s\n\n" % (
        service.timelines.position_token(owner, update.row_key).encode(),
        orjson.dumps(update.to_json()),
    )
