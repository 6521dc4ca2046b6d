"""Logging set-up shared by every program's ``main()``: plain lines, or one JSON object a line.

While the API handles a request, every line carries that request's id (``REQUEST_ID``, a
context variable: the API's middleware sets it in the request's task, and whatever runs in
that task or in tasks it starts, library code included, logs with it).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import IO, Literal

from pythonjsonlogger.orjson import OrjsonFormatter

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
"""The id of the request being handled, if any."""


class RequestIdFilter(logging.Filter):
    """Gives a record logged while a request is handled a ``request_id`` attribute."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None:
            record.request_id = request_id
        return True


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, with `` request_id=...`` after the message of a request's lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        request_id = getattr(record, "request_id", None)
        return line if request_id is None else f"{line} request_id={request_id}"


def log_handler(log_format: LogFormat, stream: IO[str] | None = None) -> logging.Handler:
    """A handler writing ``log_format`` lines to ``stream`` (standard error by default)."""
    handler = logging.StreamHandler(stream)
    if log_format == "json":  # extra attributes (request_id, aiohttp's access fields) too
        handler.setFormatter(
            OrjsonFormatter(
                ["levelname", "name", "message"],
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp="time",
            )
        )
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
    handler.addFilter(RequestIdFilter())
    return handler


def configure_logging(log_format: LogFormat) -> None:
    """Log ``log_format`` lines (``Settings.log_format``), Python's warnings among them; the
    Azure SDK's per-request HTTP logging stays off."""
    logging.basicConfig(level=logging.INFO, handlers=[log_handler(log_format)])
    logging.captureWarnings(True)
    logging.getLogger("azure").setLevel(logging.WARNING)
