"""Blocks, mutes and keyword filters: handlers and their routes (``RELATION_OPERATIONS``,
added to the route table by ``api.app``)."""

from __future__ import annotations

from datetime import datetime

from aiohttp import web

from api import routes, schemas
from api.openapi import Operation
from api.responses import json_response
from timeline.errors import InvalidInputError


def _pair(request: web.Request) -> tuple[str, str]:
    return request.match_info["user_id"], request.match_info["target"]


async def block(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).relations.block(actor, *_pair(request))
    return web.Response(status=204)


async def unblock(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).relations.unblock(actor, *_pair(request))
    return web.Response(status=204)


async def list_blocks(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).relations.blocks(
        actor, request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def mute(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    body = schemas.MuteRequest()
    if request.can_read_body:
        body = await routes._body(request, schemas.MuteRequest)
    expires_at = None if body.expires_at is None else _rfc3339(body.expires_at)
    await routes._service(request).relations.mute(actor, *_pair(request), expires_at, body.reposts)
    return web.Response(status=204)


async def unmute(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).relations.unmute(actor, *_pair(request))
    return web.Response(status=204)


async def list_mutes(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).relations.mutes(
        actor, request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def add_filter(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    body = await routes._body(request, schemas.FilterRequest)
    expires_at = None if body.expires_at is None else _rfc3339(body.expires_at)
    owner = request.match_info["user_id"]
    found = await routes._service(request).relations.add_filter(
        actor, owner, body.phrase, expires_at
    )
    location = f"/users/{owner}/filters/{found['filter_id']}"
    return json_response(found, status=201, headers={"Location": location})


async def delete_filter(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).relations.delete_filter(
        actor, request.match_info["user_id"], request.match_info["filter_id"]
    )
    return web.Response(status=204)


async def list_filters(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).relations.filters(
        actor, request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


def _rfc3339(text: str) -> datetime:
    """An RFC 3339 time with its offset (``Z`` or ``+hh:mm``); anything else is a 400."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or "T" not in text.upper() or moment.tzinfo is None:
        raise InvalidInputError(
            "expires_at must be an RFC 3339 time with an offset, such as 2030-01-01T00:00:00Z",
            code="invalid_expiry",
        )
    return moment


RELATION_OPERATIONS = [
    Operation("PUT", "/users/{user_id}/blocks/{target}", block,
              "Block a user (idempotent): ends follows both ways, refuses new ones (403 "
              "blocked), hides each side's posts and reposts from the other at once",
              status=204, auth=True, errors=(404, 409, 429)),
    Operation("DELETE", "/users/{user_id}/blocks/{target}", unblock,
              "Unblock a user (idempotent; follows are not restored)", status=204, auth=True,
              errors=(404, 429)),
    Operation("GET", "/users/{user_id}/blocks", list_blocks, "Whom the user blocks (private)",
              response=schemas.EdgePage, auth=True, paged=True),
    Operation("PUT", "/users/{user_id}/mutes/{target}", mute,
              "Mute a user (idempotent; the body is optional): their posts, and their reposts "
              "unless reposts is false, leave the home timeline and stream at once until the "
              "unmute or expires_at", status=204, auth=True, request=schemas.MuteRequest,
              errors=(404, 409, 429)),
    Operation("DELETE", "/users/{user_id}/mutes/{target}", unmute,
              "Unmute a user (idempotent; their posts show again at once)", status=204,
              auth=True, errors=(404, 429)),
    Operation("GET", "/users/{user_id}/mutes", list_mutes, "Whom the user mutes (private)",
              response=schemas.MutePage, auth=True, paged=True),
    Operation("POST", "/users/{user_id}/filters", add_filter,
              "Add a keyword filter: entries whose text holds the phrase as whole words "
              "(ignoring case) leave the home timeline and stream at once, until it is deleted "
              "or expires_at (at most 100 filters: 409 too_many_filters)", status=201,
              request=schemas.FilterRequest, response=schemas.FilterOut, auth=True,
              errors=(409, 429), headers={"Location": "the new filter"}),
    Operation("GET", "/users/{user_id}/filters", list_filters,
              "The user's keyword filters, by filter id (private)", response=schemas.FilterPage,
              auth=True, paged=True),
    Operation("DELETE", "/users/{user_id}/filters/{filter_id}", delete_filter,
              "Delete a keyword filter: what it hid shows again at once", status=204, auth=True,
              errors=(404, 429)),
]  # fmt: skip
