"""Shared set-up for the lean-path tests: an HTTP front to Azurite that answers 503."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web
from yarl import URL

from timeline.tools.azurite import ACCOUNT, ACCOUNT_KEY, HOST, Azurite


class BusyFront:
    """An HTTP front to Azurite's table (or queue) port that answers ``503 ServerBusy`` (as
    Azure does when throttling) to the next ``busy`` requests of ``methods`` and passes
    everything else through; ``hits`` counts the requests of ``methods`` it saw,
    ``request_ids`` their ``x-ms-client-request-id``."""

    def __init__(
        self, azurite: Azurite, methods: Iterable[str] = ("PUT",), *, queue: bool = False
    ) -> None:
        self.target = f"http://{HOST}:{azurite.ports[1 if queue else 2]}"
        self.methods = set(methods)
        self.queue = queue
        self.busy = 0
        self.hits = 0
        self.request_ids: list[str | None] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method in self.methods:
            self.hits += 1
            self.request_ids.append(request.headers.get("x-ms-client-request-id"))
            if self.busy > 0:
                self.busy -= 1
                return _busy(self.queue)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(
                request.method,
                URL(self.target + request.raw_path, encoded=True),
                headers=headers,
                data=body or None,
                skip_auto_headers=("Content-Type",),
            ) as answer,
        ):
            passed = {
                k: v
                for k, v in answer.headers.items()
                if k.lower() not in ("transfer-encoding", "content-length", "connection")
            }
            return web.Response(status=answer.status, body=await answer.read(), headers=passed)

    def connection_string(self) -> str:
        service = "Queue" if self.queue else "Table"
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"{service}Endpoint=http://{HOST}:{self.port}/{ACCOUNT};"
        )


def _busy(queue: bool) -> web.Response:
    """Azure's ``503 ServerBusy``: XML from the queue service, JSON from the table service."""
    if queue:
        body = (
            b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
            b"<Message>busy</Message></Error>"
        )
        content_type = "application/xml"
    else:
        body = b'{"odata.error":{"code":"ServerBusy","message":{"value":"busy"}}}'
        content_type = "application/json"
    headers = {"x-ms-error-code": "ServerBusy", "Content-Type": content_type}
    return web.Response(status=503, body=body, headers=headers)


@asynccontextmanager
async def busy_front_on(
    azurite: Azurite, methods: Iterable[str] = ("PUT",), *, queue: bool = False
) -> AsyncIterator[BusyFront]:
    """A running ``BusyFront`` on a free port, stopped on exit."""
    front = BusyFront(azurite, methods, queue=queue)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", front.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0)
    await site.start()
    front.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield front
    finally:
        await runner.cleanup()
