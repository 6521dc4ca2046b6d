"""Serving the app on a socket, with the connection limits ``web.run_app`` lacks.

aiohttp bounds an idle connection (``keepalive_timeout``, counted from the connection's start
and from each response) but not a client that starts a request and never finishes it, nor how
many connections a process holds, nor how long a shutdown takes. Here:

- **headers**: from a request's first byte, its headers must be complete within
  ``TIMELINE_HEADER_TIMEOUT_S``, or the client gets a 408 ``header_timeout`` and the
  connection is closed (``GuardedHandler``);
- **body**: ``api.routes`` reads a body within ``TIMELINE_BODY_TIMEOUT_S`` (408
  ``body_timeout``); a body no handler reads is drained for at most ``LINGER_S``;
- **idle**: ``TIMELINE_KEEPALIVE_TIMEOUT_S``, aiohttp's own keep-alive timer;
- **cap**: connection ``TIMELINE_MAX_CONNECTIONS`` + 1 is accepted, answered 503
  ``overloaded`` with ``Retry-After`` and closed (``Refusal``): refused, not queued, so a load
  balancer retries it on another process at once;
- **shutdown**: ``serve`` stops listening, ends the live streams, gives requests in flight
  half of ``TIMELINE_API_SHUTDOWN_GRACE_S``, then cancels them, and closes whatever is left
  when the grace period ends.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
from typing import Any

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter

from timeline.config import Settings
from timeline.startup import api_port_taken

log = logging.getLogger(__name__)

LINGER_S = 2.0
"""How long a connection drains a body its handler did not read before it is closed."""

CONNECTIONS_REFUSED = Counter(
    "timeline_http_connections_refused_total",
    "Connections answered 503 and closed because the process held its maximum",
)
HEADER_TIMEOUTS = Counter(
    "timeline_http_header_timeouts_total",
    "Connections closed with a 408 because a request's headers did not arrive in time",
)


def _raw_response(status: str, code: str, message: str, extra: str = "") -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for the two cases answered
    below aiohttp (no request was parsed, so there is no request to answer through it)."""
    body = orjson.dumps({"error": {"code": code, "message": message}})
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode("ascii") + body


class GuardedHandler(RequestHandler):
    """aiohttp's connection protocol plus a header deadline.

    The timer starts when bytes arrive while the connection waits for a request (aiohttp's
    ``_waiter`` is pending: no complete request head is queued) and stops when the bytes
    complete one. Bytes of a body, or of a pipelined request while one is handled, never
    start it: the handler is running then, and aiohttp's keep-alive timer covers the gap
    after its response.
    """

    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._header_timer: asyncio.TimerHandle | None = None

    def _awaiting_request(self) -> bool:
        waiter = self._waiter
        return waiter is not None and not waiter.done()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._awaiting_request():
            self._stop_header_timer()
        elif data and self._header_timer is None:
            self._header_timer = asyncio.get_running_loop().call_later(
                self._header_timeout_s, self._headers_late
            )

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self._awaiting_request() or self.transport is None:
            return
        HEADER_TIMEOUTS.inc()
        self.transport.write(
            _raw_response(
                "408 Request Timeout",
                "header_timeout",
                f"the request's headers did not arrive within {self._header_timeout_s:g} s",
            )
        )
        self.force_close()  # the transport sends what it was given, then closes

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)


class Refusal(asyncio.Protocol):
    """A connection over the cap: answered 503 at once, then closed once the client has
    closed (or after ``LINGER_S``). Its request, if sent, is read and dropped: closing with
    unread bytes would reset the connection and could lose the answer."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        CONNECTIONS_REFUSED.inc()
        transport.write(
            _raw_response(
                "503 Service Unavailable",
                "overloaded",
                "this process holds as many connections as it may; try again",
                "Retry-After: 1\r\n",
            )
        )
        self._closer = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        """The request is not read: it is refused whatever it is."""

    def connection_lost(self, exc: Exception | None) -> None:
        self._closer.cancel()


class ConnectionFactory:
    """What the listening socket calls per connection: a ``GuardedHandler`` registered with
    the app's server, or a ``Refusal`` when the process already holds ``max_connections``.
    The socket is bound before the runner is set up, so the server is read per connection
    (the socket accepts none before then)."""

    def __init__(self, runner: web.AppRunner, settings: Settings) -> None:
        self._runner = runner
        self._max = settings.max_connections
        self._options: dict[str, Any] = {
            "header_timeout_s": settings.header_timeout_s,
            "keepalive_timeout": settings.keepalive_timeout_s,
            "lingering_time": LINGER_S,
        }
        if not settings.access_log:
            self._options["access_log"] = None  # aiohttp then builds no access logger

    def __call__(self) -> asyncio.Protocol:
        server = self._runner.server
        assert server is not None  # set up before the socket starts accepting
        if len(server.connections) >= self._max:
            return Refusal()
        loop = asyncio.get_running_loop()
        return GuardedHandler(server, loop=loop, **self._options)


async def serve(app: web.Application, settings: Settings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, then stop within the grace period."""
    grace = settings.api_shutdown_grace_s
    # Each connection gets a quarter of the grace period to finish, then another to end once
    # cancelled (aiohttp's two waits), leaving half for the app's own cleanup.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=grace / 4)
    listener = await _bind(ConnectionFactory(runner, settings), settings)
    try:
        await runner.setup()
    except BaseException:
        listener.close()
        raise
    server = runner.server
    assert server is not None
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await listener.start_serving()
    log.info("serving on %s:%s", settings.host, settings.port)
    await stop.wait()
    listener.close()
    await _stop_within(runner, server, grace)


async def _bind(factory: ConnectionFactory, settings: Settings) -> asyncio.Server:
    """The API's socket, bound but not yet listening (a client is refused until the app has
    opened storage), so a port another program holds stops the API before anything starts,
    with one line (``ConfigurationError``) rather than a traceback."""
    try:
        return await asyncio.get_running_loop().create_server(
            factory,
            host=settings.host,
            port=settings.port,
            reuse_port=settings.api_processes > 1,  # processes of one stack share the port
            start_serving=False,
        )
    except OSError as error:
        if error.errno != errno.EADDRINUSE:
            raise
        raise api_port_taken(settings.host, settings.port) from error


async def _stop_within(runner: web.AppRunner, server: web.Server, grace: float) -> None:
    """``runner.cleanup`` (end streams, finish or cancel requests, close storage), cut short
    when the grace period ends: then every connection still open is closed."""
    try:
        async with asyncio.timeout(grace):
            await runner.cleanup()
    except TimeoutError:
        left = server.connections
        log.warning("shutdown grace period over: closing %d connection(s)", len(left))
        for connection in left:
            connection.force_close()
