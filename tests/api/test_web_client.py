"""The web client's files: served at ``/``, self-contained (nothing from another origin)."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from api.web import FILES

SCRIPTS = [
    "app",
    "api",
    "ui",
    "timeline",
    "paging",
    "markers",
    "stream",
    "compose",
    "following",
    "account",
    "settings",
    "requests",
    "lists",
    "social",
    "profile",
]


@pytest.mark.parametrize(("path", "content_type"), [
    ("/", "text/html"), ("/web/style.css", "text/css"),
    *((f"/web/{name}.js", "text/javascript") for name in SCRIPTS),
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
    assert '<script type="module" src="/web/app.js"></script>' in page
    assert '<script src="/web/social.js" defer></script>' in page
    # in this order: each script builds on the one before
    assert page.index('src="/web/app.js"') < page.index('src="/web/social.js"')
    assert page.index('src="/web/social.js"') < page.index('src="/web/profile.js"')
    assert 'href="/web/style.css"' in page
    for name, _ in FILES.values():
        text = (resources.files("api") / "static" / name).read_text()
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), name


async def test_every_module_the_client_imports_is_served(client: TestClient[Any, Any]) -> None:
    static = resources.files("api") / "static"
    scripts = {name for name, _ in FILES.values() if name.endswith(".js")}
    on_disk = {entry.name for entry in static.iterdir() if entry.name.endswith(".js")}
    assert scripts == on_disk  # none left out of the server's list
    imported = set()
    for name in scripts:
        text = (static / name).read_text()
        assert text.startswith("// "), f"{name}: a one-line header says what it holds"
        assert len(text.splitlines()) <= 400, f"{name}: split it by concern"
        imported |= set(re.findall(r'^import [^;]*? from "\./([\w-]+\.js)";$', text, re.M | re.S))
    assert imported == scripts - {"app.js", "social.js", "profile.js"}
    for name in imported:
        response = await client.get(f"/web/{name}")
        assert response.status == 200
        assert response.content_type == "text/javascript"


async def test_writes_to_the_page_are_json_errors(client: TestClient[Any, Any]) -> None:
    response = await client.post("/", data=b"x")
    assert response.status == 405
    assert (await response.json())["error"]["code"] == "method_not_allowed"
