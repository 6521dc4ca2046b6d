"""Handlers and the route table; OpenAPI and the router are both built from ``OPERATIONS``."""

from __future__ import annotations

import asyncio
import re
from typing import TypeVar

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from api import reposts, schemas, stream
from api.clients import client_address
from api.docs import docs_page
from api.keys import OPENAPI_KEY, SERVICE_KEY, SETTINGS_KEY, STORAGE_KEY
from api.openapi import Operation
from api.responses import json_response
from timeline.errors import (
    AuthenticationError,
    InvalidInputError,
    PayloadTooLargeError,
    RequestTimeoutError,
    StorageUnavailableError,
    UnsupportedMediaTypeError,
)
from timeline.service.operations import TimelineService
from timeline.service.paging import PageOut

M = TypeVar("M", bound=BaseModel)
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]{1,9}")
_JSON_MAX_DEPTH = 1024
"""orjson's fixed nesting limit: deeper arrays and objects are refused."""


def _service(request: web.Request) -> TimelineService:
    return request.app[SERVICE_KEY]


async def _actor(request: web.Request) -> str:
    """The user the bearer token acts as: signature, expiry and revocations checked
    (``timeline.service.credentials``)."""
    return await _service(request).accounts.authenticate(_bearer(request))


async def _reader(request: web.Request) -> str | None:
    """Who reads a public route: the bearer token's user when one is sent (checked as on any
    route), else None (anonymous: no followers-only posts)."""
    if "Authorization" not in request.headers:
        return None
    return await _actor(request)


def _client(request: web.Request) -> str:
    """The client's address, through the trusted proxies (``api.clients``)."""
    settings = request.app[SETTINGS_KEY]
    return client_address(request, settings.trusted_proxies, settings.trusted_proxy_header)


def _bearer(request: web.Request) -> str:
    """The bearer token as sent, not yet verified.

    A header that is present but garbled (say one non-UTF-8 byte) is an invalid token, not a
    missing one; the token itself is left to ``TokenSigner.verify``, which rejects anything not
    ASCII.
    """
    header = request.headers.get("Authorization", "").strip()
    scheme, _, token = header.partition(" ")
    if header and scheme.lower() != "bearer":
        raise AuthenticationError("only Bearer tokens are accepted", code="invalid_token")
    if not token.strip():
        raise AuthenticationError("send 'Authorization: Bearer <token>'", code="missing_token")
    return token.strip()


async def _body(request: web.Request, model: type[M]) -> M:
    if request.content_type != "application/json":
        raise UnsupportedMediaTypeError("send the body as application/json")
    settings = request.app[SETTINGS_KEY]
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLargeError(
            f"request bodies are limited to {settings.max_body_bytes} bytes"
        ) from None
    except TimeoutError:
        request.content.feed_eof()  # given up: close the connection now, do not drain it
        raise RequestTimeoutError(
            f"the body did not arrive within {settings.body_timeout_s:g} s", code="body_timeout"
        ) from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise InvalidInputError(_json_problem(raw, error), code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidInputError("the body must be a JSON object", code="invalid_body")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise InvalidInputError(f"{where}: {first['msg']}", code="invalid_body") from None


def _json_problem(raw: bytes, error: orjson.JSONDecodeError) -> str:
    """What is wrong with a body orjson refused, in words a client can act on."""
    where = f"line {error.lineno} column {error.colno}"
    if error.msg.startswith("depth limit exceeded"):
        return f"the body's JSON nests deeper than {_JSON_MAX_DEPTH} levels (at {where})"
    if error.msg.startswith("number is infinity"):
        return f"the body holds a number too large for a double (at {where})"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"the body is not valid UTF-8 (byte {bad.start})"
    return f"the body is not valid JSON: {error.msg} (at {where})"


def _limit(request: web.Request) -> int | None:
    """A whole number as sent (a sign included); the pager checks it is 1..page size."""
    raw = request.query.get("limit")
    if raw is None:
        return None
    if not _WHOLE_NUMBER.fullmatch(raw):
        page_size = request.app[SETTINGS_KEY].page_size
        raise InvalidInputError(
            f"limit must be a whole number between 1 and {page_size}", code="invalid_limit"
        )
    return int(raw)


def _continuation(request: web.Request) -> str | None:
    """The continuation as given; an empty one is invalid (the service rejects it), like an
    empty ``limit``."""
    return request.query.get("continuation")


def _since(request: web.Request) -> str | None:
    """A newer-than read's position (a page's ``newest``); the service checks it."""
    return request.query.get("since")


def _idempotency_key(request: web.Request) -> str | None:
    return request.headers.get("Idempotency-Key")


def _page(page: PageOut) -> web.Response:
    return json_response({"items": page.items, "continuation": page.continuation})


def _post_page(page: PageOut) -> web.Response:
    return json_response(
        {"items": page.items, "continuation": page.continuation, "newest": page.newest}
    )


async def register(request: web.Request) -> web.Response:
    body = await _body(request, schemas.RegisterRequest)
    user, token = await _service(request).accounts.register(
        body.user_id,
        body.display_name,
        client=_client(request),
        idempotency_key=_idempotency_key(request),
    )
    return json_response(
        {"user_id": user.user_id, "display_name": user.display_name, "token": token},
        status=201,
        headers={"Location": f"/users/{user.user_id}"},
    )


async def get_user(request: web.Request) -> web.Response:
    user = await _service(request).accounts.profile(request.match_info["user_id"])
    return json_response(user.to_json())


async def edit_user(request: web.Request) -> web.Response:
    actor = await _actor(request)
    body = await _body(request, schemas.ProfileEdit)
    user = await _service(request).accounts.edit(
        actor, request.match_info["user_id"], display_name=body.display_name, locked=body.locked
    )
    return json_response(user.to_json())


async def delete_user(request: web.Request) -> web.Response:
    user_id = request.match_info["user_id"]
    await _service(request).accounts.delete(await _actor(request), user_id)
    return json_response({"user_id": user_id, "state": "deleting"}, status=202)


async def create_post(request: web.Request) -> web.Response:
    actor = await _actor(request)
    body = await _body(request, schemas.PostRequest)
    author = request.match_info["user_id"]
    reply_to = None if body.reply_to is None else (body.reply_to.author, body.reply_to.post_id)
    post = await _service(request).posts.create(
        actor,
        author,
        body.text,
        idempotency_key=_idempotency_key(request),
        reply_to=reply_to,
        followers_only=body.visibility == "followers",
    )
    return json_response(
        post.to_json(), status=202, headers={"Location": f"/users/{author}/posts/{post.post_id}"}
    )


async def list_posts(request: web.Request) -> web.Response:
    page = await _service(request).timelines.author_posts(
        request.match_info["user_id"],
        _limit(request),
        _continuation(request),
        _since(request),
        reader=await _reader(request),
    )
    return _post_page(page)


async def get_post(request: web.Request) -> web.Response:
    post = await _service(request).posts.get(
        request.match_info["user_id"], request.match_info["post_id"], await _reader(request)
    )
    return json_response(post.to_json())


async def delete_post(request: web.Request) -> web.Response:
    await _service(request).posts.delete(
        await _actor(request), request.match_info["user_id"], request.match_info["post_id"]
    )
    return web.Response(status=204)


async def home_timeline(request: web.Request) -> web.Response:
    actor = await _actor(request)
    page = await _service(request).timelines.home(
        actor, request.match_info["user_id"], _limit(request), _continuation(request),
        _since(request),
    )  # fmt: skip
    return _post_page(page)


async def get_marker(request: web.Request) -> web.Response:
    marker = await _service(request).markers.get(
        await _actor(request), request.match_info["user_id"]
    )
    return json_response({"position": marker.position, "version": marker.version})


async def put_marker(request: web.Request) -> web.Response:
    actor = await _actor(request)
    body = await _body(request, schemas.MarkerRequest)
    marker = await _service(request).markers.put(
        actor, request.match_info["user_id"], body.position, body.version
    )
    return json_response({"position": marker.position, "version": marker.version})


async def revoke_token(request: web.Request) -> web.Response:
    await _service(request).accounts.revoke_token(_bearer(request), request.match_info["user_id"])
    return web.Response(status=204)


async def revoke_all_tokens(request: web.Request) -> web.Response:
    await _service(request).accounts.revoke_all(
        await _actor(request), request.match_info["user_id"]
    )
    return web.Response(status=204)


async def timeline_stream(request: web.Request) -> web.StreamResponse:
    token = _bearer(request)
    return await stream.serve(request, _service(request), token, request.match_info["user_id"])


async def healthz(_request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    missing = await request.app[STORAGE_KEY].missing_resources()
    if missing:
        raise StorageUnavailableError(
            f"storage is reachable but missing {', '.join(missing)}: run `timeline init`",
            retry_after=5,
            code="not_ready",
        )
    return json_response({"status": "ready"})


async def metrics(_request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return json_response(request.app[OPENAPI_KEY])


OPERATIONS = [
    Operation("POST", "/users", register, "Register a user", status=201,
              request=schemas.RegisterRequest, response=schemas.Registered, errors=(409, 422, 429),
              headers={"Location": "the new user's profile"}, idempotent=True),
    Operation("GET", "/users/{user_id}", get_user, "A user's profile with counts",
              response=schemas.Profile, errors=(404,)),
    Operation("PATCH", "/users/{user_id}", edit_user,
              "Change the display name or whether follows need approval (locked)",
              request=schemas.ProfileEdit, response=schemas.Profile, auth=True,
              errors=(404, 429)),
    Operation("DELETE", "/users/{user_id}", delete_user,
              "Delete the account: its tokens are refused, its profile is gone and its id "
              "stays taken at once; its posts, reposts, follows, lists and blocks go in the "
              "background", status=202, response=schemas.AccountDeleting, auth=True,
              errors=(404, 429)),
    Operation("POST", "/users/{user_id}/posts", create_post, "Publish a post", status=202,
              request=schemas.PostRequest, response=schemas.PostOut, auth=True,
              errors=(404, 409, 422, 429),
              headers={"Location": "the new post"}, idempotent=True),
    Operation("DELETE", "/users/{user_id}/tokens/current", revoke_token,
              "Sign out: revoke the token this request presents (every API process refuses "
              "it within TIMELINE_CREDENTIALS_CACHE_S)", status=204, auth=True),
    Operation("DELETE", "/users/{user_id}/tokens", revoke_all_tokens,
              "Sign out everywhere: revoke every token of the user minted so far", status=204,
              auth=True, errors=(404,)),
    Operation("GET", "/users/{user_id}/posts", list_posts,
              "A user's own posts, newest first (followers-only ones to followers)",
              response=schemas.PostPage, paged=True, since=True, errors=(404,),
              optional_auth=True),
    Operation("GET", "/users/{user_id}/posts/{post_id}", get_post,
              "One post (a followers-only one to followers only)", response=schemas.PostOut,
              errors=(404,), optional_auth=True),
    Operation("DELETE", "/users/{user_id}/posts/{post_id}", delete_post,
              "Delete a post (removed from timelines asynchronously)", status=204, auth=True,
              errors=(404, 429)),
    Operation("GET", "/users/{user_id}/timeline", home_timeline,
              "The user's home timeline, newest first", response=schemas.PostPage, auth=True,
              paged=True, since=True),
    Operation("GET", "/users/{user_id}/markers/home", get_marker,
              "Where the user stopped reading the home timeline (position null, version 0 "
              "before the first write)", response=schemas.Marker, auth=True),
    Operation("PUT", "/users/{user_id}/markers/home", put_marker,
              "Move the read marker: send the version last read (0 for none); a retry of the "
              "same write answers as the first did", request=schemas.MarkerRequest,
              response=schemas.Marker, auth=True, errors=(409,)),
    Operation("GET", "/users/{user_id}/timeline/stream", timeline_stream,
              "The user's home timeline live, as Server-Sent Events (one `post` event per "
              "new entry, its position as the event id; resume with Last-Event-ID)",
              auth=True, raw_content_type="text/event-stream", since=True, resumable=True,
              errors=(429, 503)),
    *reposts.OPERATIONS,
    Operation("GET", "/healthz", healthz, "The process is alive", response=schemas.Status,
              head=True),
    Operation("GET", "/readyz", readyz, "Storage is reachable and initialised",
              response=schemas.Status, head=True),
    Operation("GET", "/metrics", metrics, "Prometheus metrics",
              raw_content_type="text/plain"),
    Operation("GET", "/openapi.json", openapi, "This document",
              raw_content_type="application/json"),
    Operation("GET", "/docs", docs_page, "This document in Swagger UI", errors=(404,),
              raw_content_type="text/html"),
]  # fmt: skip
