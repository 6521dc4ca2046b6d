"""JSON responses encoded with orjson."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web


def json_response(
    body: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


def error_response(status: int, code: str, message: str) -> web.Response:
    return json_response({"error": {"code": code, "message": message}}, status=status)
