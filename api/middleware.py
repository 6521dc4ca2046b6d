"""The one error middleware (every failure becomes a JSON error) and request metrics."""

from __future__ import annotations

import logging
import time

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
    RetryableError,
    StorageUnavailableError,
    TimelineError,
    UnsupportedMediaTypeError,
)

log = logging.getLogger(__name__)

_STATUS_BY_ERROR: tuple[tuple[type[TimelineError], int], ...] = (
    (PayloadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (InvalidInputError, 400),
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    (NotFoundError, 404),
    (ConflictError, 409),
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
    "timeline_http_requests_total", "HTTP requests served", ["method", "route", "status"]
)
LATENCY = Histogram(
    "timeline_http_request_duration_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)


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
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal error; it has been logged")


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    response = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    LATENCY.labels(request.method, route).observe(time.perf_counter() - started)
    REQUESTS.labels(request.method, route, str(response.status)).inc()
    return response
