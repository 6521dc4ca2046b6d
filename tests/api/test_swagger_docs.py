"""``GET /docs``: Swagger UI over ``/openapi.json``, every file of it served by the API."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from api.docs import CONTENT_SECURITY_POLICY, add_docs, docs_page
from api.middleware import MIDDLEWARES
from tests.helpers import body_of, error_of

Client = TestClient[Any, Any]


class _References(HTMLParser):
    """Every URL a page loads: ``src`` of any element, ``href`` of a ``link``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is not None and (name == "src" or (tag == "link" and name == "href")):
                self.urls.append(value)


def _local(url: str) -> bool:
    return url.startswith("/") and not url.startswith("//")


async def test_docs_page_loads_only_local_assets_and_points_at_openapi(client: Client) -> None:
    response = await client.get("/docs")
    assert response.status == 200
    assert response.content_type == "text/html"
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "default-src 'self'" in CONTENT_SECURITY_POLICY
    page = await response.text()
    assert "http:" not in page
    assert "https:" not in page
    parser = _References()
    parser.feed(page)
    assert len(parser.urls) == 4, parser.urls  # stylesheet, icon, bundle, start script
    assert all(_local(url) for url in parser.urls), parser.urls

    expected = {".css": "text/css", ".js": "javascript", ".png": "image/png"}
    scripts = []
    for url in parser.urls:
        asset = await client.get(url)
        assert asset.status == 200, url
        assert expected[Path(url).suffix] in asset.content_type, (url, asset.content_type)
        assert len(await asset.read()) > 0
        if url.endswith(".js"):
            scripts.append(await asset.text())
    start = scripts[-1]
    assert 'url: "/openapi.json"' in start
    assert "validatorUrl: null" in start  # no call to Swagger's online validator
    assert "SwaggerUIBundle" in scripts[0]


async def test_docs_page_is_in_the_openapi_document(client: Client) -> None:
    spec = await body_of(await client.get("/openapi.json"))
    ok = spec["paths"]["/docs"]["get"]["responses"]["200"]
    assert ok["content"] == {"text/html": {"schema": {"type": "string"}}}


async def test_docs_assets_outside_the_package_are_not_served(client: Client) -> None:
    for path in ("/docs/assets/../package.json", "/docs/assets/%2e%2e/package.json"):
        assert await error_of(await client.get(path), 404) == "not_found"
    assert (await client.get("/docs/assets/nope.js")).status == 404


async def test_without_swagger_ui_installed_docs_is_a_404_saying_why(tmp_path: Path) -> None:
    app = web.Application(middlewares=MIDDLEWARES)
    app.router.add_get("/docs", docs_page)
    add_docs(app, node_modules=tmp_path)  # an empty node_modules
    async with TestClient(TestServer(app)) as client:
        assert await error_of(await client.get("/docs"), 404) == "docs_not_installed"


async def test_odd_asset_names_are_404s_not_500s(client: Client) -> None:
    """A name too long for the file system reached aiohttp's static handler as an OSError."""
    for name in ("a" * 300, "a%0aforged", "%00", "swagger-ui.css%2f..", "." * 255):
        for method in ("GET", "HEAD"):
            response = await client.request(method, f"/docs/assets/{name}")
            assert response.status == 404, (method, name)


async def test_an_unhandled_error_logs_its_path_on_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The path is logged escaped: a decoded newline in it cannot forge a log line."""

    async def broken(_request: web.Request) -> web.Response:
        raise RuntimeError("boom")

    app = web.Application(middlewares=MIDDLEWARES)
    app.router.add_get("/{anything}", broken)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/x%0aapi.audit INFO admin token rotated")
        assert await error_of(response, 500) == "internal_error"
    (record,) = [r for r in caplog.records if r.getMessage().startswith("unhandled error")]
    assert "\n" not in record.getMessage()
