"""``GET /docs``: Swagger UI over ``/openapi.json``, from the pinned npm ``swagger-ui-dist``.

Everything the page loads is served by this API: the package's files from ``node_modules``
(found when the app is created, not at import) under ``/docs/assets/``, and the few lines
that start Swagger UI at ``/docs/init.js``. The page's Content-Security-Policy allows this
origin only, so the browser itself refuses any CDN or Swagger's online validator.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from timeline.errors import ConfigurationError, NotFoundError
from timeline.tools.azurite import find_node_modules

log = logging.getLogger(__name__)

PACKAGE = "swagger-ui-dist"
ASSETS = "/docs/assets"
INIT_SCRIPT = "/docs/init.js"
OPENAPI_URL = "/openapi.json"
SWAGGER_UI_KEY = web.AppKey("swagger_ui", Path)
"""The installed package's folder; absent when it is not installed."""

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)  # Swagger UI sets inline styles and draws its icons as data: images

PAGE = f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Timeline fan-out service: API</title>
  <link rel="stylesheet" href="{ASSETS}/swagger-ui.css">
  <link rel="icon" type="image/png" href="{ASSETS}/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{ASSETS}/swagger-ui-bundle.js"></script>
  <script src="{INIT_SCRIPT}"></script>
</body>
</html>
"""

INIT = f"""window.ui = SwaggerUIBundle({{
  url: "{OPENAPI_URL}",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
}});
"""


def add_docs(app: web.Application, node_modules: Path | None = None) -> None:
    """Serve Swagger UI's files and its start script; ``/docs`` itself is in the route table.

    Without the package installed the API still runs, and ``/docs`` answers 404 saying why.
    """
    try:
        folder = (node_modules or find_node_modules(package=PACKAGE)) / PACKAGE
    except ConfigurationError as error:
        log.warning("no /docs page: %s", error.message)
        return
    if not (folder / "swagger-ui-bundle.js").is_file():
        log.warning("no /docs page: %s is not installed in %s", PACKAGE, folder.parent)
        return
    app[SWAGGER_UI_KEY] = folder
    assets = {path.name: path for path in folder.iterdir() if path.is_file()}
    app.router.add_get(ASSETS + "/{name}", _asset_handler(assets), name="docs_assets")
    app.router.add_get(INIT_SCRIPT, _init_script, name="docs_init")


def _asset_handler(assets: dict[str, Path]) -> Handler:
    """Serve only the package's own files, by name: no path from a request reaches the
    file system (a long or odd name is a plain 404, not an ``OSError``)."""

    async def asset(request: web.Request) -> web.FileResponse:
        path = assets.get(request.match_info["name"])
        if path is None:
            raise NotFoundError("no such docs asset", code="not_found")
        return web.FileResponse(path)

    return asset


async def docs_page(request: web.Request) -> web.Response:
    if SWAGGER_UI_KEY not in request.app:
        raise NotFoundError(
            f"the docs page needs {PACKAGE}: run `npm ci` in the project",
            code="docs_not_installed",
        )
    return web.Response(
        text=PAGE,
        content_type="text/html",
        headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY},
    )


async def _init_script(_request: web.Request) -> web.Response:
    return web.Response(text=INIT, content_type="text/javascript")
