"""``GET /users/{id}/timeline/stream``: a home timeline as Server-Sent Events.

Each event is one timeline entry (``event: post``, ``data:`` the post as JSON) with its
position as the ``id:``, so a client that reconnects sends ``Last-Event-ID`` and resumes
where it left off (``timeline.live`` says why it may see a few entries again). A comment
line goes out when nothing else has for the heartbeat interval, so proxies keep the
connection and a dead client is noticed. A process serves at most ``TIMELINE_MAX_STREAMS``
streams (503 beyond), and ends them all when it shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import orjson
from aiohttp import web

from timeline.entities import Post
from timeline.errors import OverloadedError
from timeline.live import StreamTiming
from timeline.service import TimelineService

RETRY_MS = 2000
"""What a client waits before it reconnects (the SSE ``retry:`` field)."""


class Streams:
    """The live streams of this process: how many may run, and the signal to end them."""

    def __init__(self, capacity: int, timing: StreamTiming) -> None:
        self.capacity = capacity
        self.timing = timing
        self.open = 0
        self.stopping = asyncio.Event()

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        if self.open >= self.capacity or self.stopping.is_set():
            raise OverloadedError(
                f"this process already serves {self.open} live streams; try again later "
                "or read the timeline with 'since'",
                retry_after=5,
            )
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1

    async def stop(self, _app: web.Application) -> None:
        """``on_shutdown``: end every stream, so shutdown does not wait for clients."""
        self.stopping.set()


STREAMS_KEY = web.AppKey("streams", Streams)


async def serve(
    request: web.Request, service: TimelineService, actor: str, owner: str
) -> web.StreamResponse:
    """Check everything before the 200, then send entries as they land."""
    streams = request.app[STREAMS_KEY]
    since = request.headers.get("Last-Event-ID") or request.query.get("since")
    with streams.slot():
        watch = await service.watch_timeline(
            actor, owner, since, lookback_s=streams.timing.lookback_s
        )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        await response.write(f"retry: {RETRY_MS}\n\n".encode())
        with contextlib.suppress(ConnectionResetError):
            async for fresh in watch.updates(streams.timing, streams.stopping):
                await response.write(_events(service, owner, fresh))
                if request.transport is None or request.transport.is_closing():
                    break
        return response


def _events(service: TimelineService, owner: str, posts: list[Post]) -> bytes:
    """The SSE frames of ``posts``, or a heartbeat comment when there are none."""
    if not posts:
        return b": heartbeat\n\n"
    return b"".join(
        b"event: post\nid: %s\ndata: %s\n\n"
        % (service.position_token(owner, post.row_key).encode(), orjson.dumps(post.to_json()))
        for post in posts
    )
