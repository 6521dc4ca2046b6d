"""The API's middlewares: request ids, request metrics, and the one error middleware (every
failure becomes a JSON error)."""

from __future__ import annotations

import logging
import re
import time
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import Counter, Histogram

from api.responses import error_response
from timeline.errors import (
    AuthenticationError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    RequestTimeoutError,
    RetryableError,
    StorageUnavailableError,
    TimelineError,
    UnprocessableError,
    UnsupportedMediaTypeError,
)
from timeline.logs import REQUEST_ID

log = logging.getLogger(__name__)

_STATUS_BY_ERROR: tuple[tuple[type[TimelineError], int], ...] = (
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (InvalidInputError, 400),
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
    (RequestTimeoutError, 408),
    (UnprocessableError, 422),
    (RateLimitedError, 429),
    (StorageUnavailableError, 503),
    (OverloadedError, 503),
)
_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}

REQUESTS = Counter(
    "timeline_http_requests_total",
    "HTTP requests answered, by method, route template and status",
    ["method", "route", "status"],
)
LATENCY = Histogram(
    "timeline_http_request_duration_seconds",
    "Time to answer an HTTP request, by method, route template and status (responses that "
    "a handler streams itself, such as Server-Sent Events, are counted but not timed)",
    ["method", "route", "status"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)
UNMATCHED_ROUTE = "unmatched"
"""The route label of every request the router matched to no route (404, 405)."""
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Method labels; any other method the HTTP parser accepts (WebDAV's, say) is ``other``."""

REQUEST_ID_HEADER = "X-Request-Id"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:+/=-]{1,128}")
"""An incoming id is kept when it is this: bounded, and nothing that could forge a log line."""


def status_for(error: TimelineError) -> int:
    for error_type, status in _STATUS_BY_ERROR:
        if isinstance(error, error_type):
            return status
    return 500


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except TimelineError as error:
        response = error_response(status_for(error), error.code, error.message)
        if isinstance(error, RetryableError):
            response.headers["Retry-After"] = str(error.retry_after)
        if isinstance(error, AuthenticationError):
            response.headers["WWW-Authenticate"] = "Bearer"
        if isinstance(error, RequestTimeoutError):
            response.force_close()  # the rest of the request may still be on its way
        return response
    except web.HTTPException as error:
        if error.status < 400:
            raise
        response = error_response(
            error.status, _HTTP_CODES.get(error.status, "http_error"), error.reason
        )
        if "Allow" in error.headers:
            response.headers["Allow"] = error.headers["Allow"]
        return response
    except Exception:
        log.exception("unhandled error in %s %r", request.method, request.path)
        return error_response(500, "internal_error", "internal error; it has been logged")


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as error:  # the error middleware lets only redirects through
        _observe(request, error.status, time.perf_counter() - started)
        raise
    # A response the handler has already sent is one it streamed itself: it has ended only
    # now, so its duration is how long the stream lasted, not a latency.
    seconds = None if response.prepared else time.perf_counter() - started
    _observe(request, response.status, seconds)
    return response


def _observe(request: web.Request, status: int, seconds: float | None) -> None:
    """Count the request under its route template (never its path: one series per route)."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else UNMATCHED_ROUTE
    method = request.method if request.method in _METHODS else "other"
    REQUESTS.labels(method, route, str(status)).inc()
    if seconds is not None:
        LATENCY.labels(method, route, str(status)).observe(seconds)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give the request its id, in ``REQUEST_ID``: every line logged in its task has it.

    Never reset: aiohttp handles each request in a task of its own (to copy the context), and
    the access log line is written in that task after the middlewares return, so the id ends
    with the request. ``echo_request_id`` puts it in the response's headers.
    """
    given = request.headers.get(REQUEST_ID_HEADER, "")
    REQUEST_ID.set(given if _SANE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex)
    return await handler(request)


async def echo_request_id(_request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every response, streamed or raised, returns the id."""
    request_id = REQUEST_ID.get()
    if request_id is not None:
        response.headers[REQUEST_ID_HEADER] = request_id


MIDDLEWARES = (request_id_middleware, metrics_middleware, error_middleware)
"""Outermost first. The request id first, so the lines the others log (the error middleware's
tracebacks) carry it. Then the metrics, outside the error middleware, so they count the status
it turned an error into (a 404, say) rather than the exception."""
