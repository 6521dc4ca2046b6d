"""One error tree for everything the service raises on purpose."""

from __future__ import annotations


class TimelineError(Exception):
    """Base of every deliberate error; ``code`` is the machine-readable reason."""

    code = "timeline_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConfigurationError(TimelineError):
    """The service cannot start as configured."""

    code = "configuration_error"


class InvalidInputError(TimelineError):
    """The client sent something malformed or out of range."""

    code = "invalid_input"


class PayloadTooLargeError(InvalidInputError):
    """The request body is larger than the service accepts."""

    code = "body_too_large"


class UnsupportedMediaTypeError(InvalidInputError):
    """The request body is not JSON."""

    code = "unsupported_media_type"


class RequestTimeoutError(TimelineError):
    """The client took longer to send its request than the server waits (408)."""

    code = "request_timeout"


class AuthenticationError(TimelineError):
    """The bearer token is missing, malformed, forged or expired."""

    code = "unauthorized"


class PermissionDeniedError(TimelineError):
    """The token is valid but its user may not act on this resource."""

    code = "forbidden"


class NotFoundError(TimelineError):
    """The addressed user, post or route does not exist."""

    code = "not_found"


class ConflictError(TimelineError):
    """The request conflicts with existing state."""

    code = "conflict"


class UnprocessableError(TimelineError):
    """Well-formed, but refused as a whole: an idempotency key reused for another request."""

    code = "unprocessable"


class RetryableError(TimelineError):
    """A condition that clears by itself; ``retry_after`` says when to try again."""

    def __init__(self, message: str, *, retry_after: int, code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.retry_after = retry_after


class RateLimitedError(RetryableError):
    """The user posts faster than the configured limit."""

    code = "rate_limited"


class StorageUnavailableError(RetryableError):
    """Azure Storage did not answer in time or answered with a server error."""

    code = "storage_unavailable"


def contention(what: str = "one partition") -> StorageUnavailableError:
    """Too many rounds lost to concurrent writers of the same rows: a retryable 503."""
    return StorageUnavailableError(f"too much contention on {what}", retry_after=1)


class OverloadedError(RetryableError):
    """This process serves as many long-lived requests (streams) as it is allowed to."""

    code = "overloaded"


class DeadlineExceededError(RetryableError):
    """A write waited so long that the storage read justifying it is too old to trust."""

    code = "write_deadline"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after=1)


class MalformedMessageError(TimelineError):
    """A queue message cannot be decoded; retrying will never help."""

    code = "malformed_message"
