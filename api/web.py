"""The web client: its static files (``api/static``) served at ``/``, read once at start.

Nothing is fetched from elsewhere at run time: the page's Content-Security-Policy allows
only this origin, so a script or style from a CDN could not load even by mistake.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web
from aiohttp.typedefs import Handler

# The scripts: app.js (start-up) and the ES modules it imports, then social.js and profile.js
# (classic scripts on top of window.timelineCore).
SCRIPTS = (
    "app.js",
    "api.js",
    "ui.js",
    "timeline.js",
    "paging.js",
    "markers.js",
    "stream.js",
    "compose.js",
    "following.js",
    "account.js",
    "settings.js",
    "requests.js",
    "lists.js",
    "social.js",
    "profile.js",
)
# URL path -> (file under api/static, content type)
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    **{f"/web/{name}": (name, "text/javascript; charset=utf-8") for name in SCRIPTS},
    "/web/style.css": ("style.css", "text/css; charset=utf-8"),
}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
}


def add_web_client(app: web.Application) -> None:
    """Add ``GET /`` (the page) and its script and style sheet to ``app``'s router."""
    static = resources.files("api") / "static"
    for path, (name, content_type) in FILES.items():
        body = (static / name).read_bytes()
        app.router.add_get(path, _serve(body, content_type), name=f"web.{name.partition('.')[0]}")


def _serve(body: bytes, content_type: str) -> Handler:
    headers = {**HEADERS, "Content-Type": content_type}

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, headers=headers)

    return handler
