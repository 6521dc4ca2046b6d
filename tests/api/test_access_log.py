"""``TIMELINE_ACCESS_LOG``: on (the default), every request served has its access line; off,
none is written (aiohttp builds no access logger for the connection)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from api.server import ConnectionFactory
from timeline.config import Settings


async def _pong(_request: web.Request) -> web.Response:
    return web.Response(text="pong")


async def _access_lines(settings: Settings, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Serve two requests through the API's own connections; the access lines logged."""
    app = web.Application()
    app.router.add_get("/ping", _pong)
    runner = web.AppRunner(app)
    await runner.setup()
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        ConnectionFactory(runner, settings), host="127.0.0.1", port=0
    )
    port = listener.sockets[0].getsockname()[1]
    try:
        with caplog.at_level(logging.INFO):
            async with aiohttp.ClientSession() as session:
                for _ in range(2):
                    async with session.get(f"http://127.0.0.1:{port}/ping") as response:
                        assert await response.text() == "pong"
    finally:
        listener.close()
        await runner.cleanup()
    return [r.getMessage() for r in caplog.records if r.name == "aiohttp.access"]


async def test_each_request_has_its_access_line_by_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = await _access_lines(Settings(), caplog)
    assert len(lines) == 2
    assert all('"GET /ping HTTP/1.1" 200' in line for line in lines)


async def test_the_access_log_switched_off_writes_none(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIMELINE_ACCESS_LOG", "false")
    assert await _access_lines(Settings(), caplog) == []
