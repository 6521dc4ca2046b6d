"""The web client's files: served at ``/``, self-contained (nothing from another origin)."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from api.web import FILES


@pytest.mark.parametrize(("path", "content_type"), [
    ("/", "text/html"), ("/web/app.js", "text/javascript"), ("/web/style.css", "text/css"),
    ("/web/social.js", "text/javascript"), ("/web/profile.js", "text/javascript"),
])  # fmt: skip
async def test_the_web_client_is_served(
    client: TestClient[Any, Any], path: str, content_type: str
) -> None:
    response = await client.get(path)
    assert response.status == 200
    assert response.content_type == content_type
    assert "default-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert (
        await response.read() == (resources.files("api") / "static" / FILES[path][0]).read_bytes()
    )
    head = await client.head(path)
    assert head.status == 200


async def test_the_page_loads_its_script_and_styles_from_this_origin(
    client: TestClient[Any, Any],
) -> None:
    page = await (await client.get("/")).text()
    assert '<script src="/web/app.js"' in page
    # in this order: each script builds on the one before
    assert page.index('src="/web/app.js"') < page.index('src="/web/social.js"')
    assert page.index('src="/web/social.js"') < page.index('src="/web/profile.js"')
    assert 'href="/web/style.css"' in page
    for name, _ in FILES.values():
        text = (resources.files("api") / "static" / name).read_text()
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), name


async def test_writes_to_the_page_are_json_errors(client: TestClient[Any, Any]) -> None:
    response = await client.post("/", data=b"x")
    assert response.status == 405
    assert (await response.json())["error"]["code"] == "method_not_allowed"
