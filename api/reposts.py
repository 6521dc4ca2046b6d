"""Handlers of reposts, a post's replies and the follow's ``reposts`` choice; their rows in
the route table (``api.routes.OPERATIONS``) come from ``OPERATIONS`` here."""

from __future__ import annotations

from aiohttp import web

from api import schemas
from api.keys import SERVICE_KEY
from api.openapi import Operation
from api.responses import json_response
from timeline.errors import InvalidInputError
from timeline.service.paging import PageOut

REPOSTS_PARAMETER = {
    "name": "reposts",
    "in": "query",
    "required": False,
    "description": "false: the followed user's reposts do not reach this timeline (true "
    "shows them again); a new follow shows them unless false, a repeated follow without "
    "it keeps the choice",
    "schema": {"type": "boolean"},
}


def reposts_choice(request: web.Request) -> bool | None:
    """The follow's ``reposts`` query parameter: true, false or absent."""
    raw = request.query.get("reposts")
    if raw is None:
        return None
    if raw not in ("true", "false"):
        raise InvalidInputError("reposts must be true or false", code="invalid_reposts")
    return raw == "true"


async def _actor(request: web.Request) -> str:
    from api.routes import _actor as actor  # the one bearer check

    return await actor(request)


async def create_repost(request: web.Request) -> web.Response:
    from api.routes import _body

    actor = await _actor(request)
    body = await _body(request, schemas.RepostRequest)
    reposter = request.match_info["user_id"]
    item = await request.app[SERVICE_KEY].reposts.repost(actor, reposter, body.author, body.post_id)
    return json_response(item, status=202)


async def delete_repost(request: web.Request) -> web.Response:
    await request.app[SERVICE_KEY].reposts.unrepost(
        await _actor(request), request.match_info["user_id"], request.match_info["post_id"]
    )
    return web.Response(status=204)


async def list_replies(request: web.Request) -> web.Response:
    from api.routes import _continuation, _limit, _reader

    page: PageOut = await request.app[SERVICE_KEY].reposts.replies(
        request.match_info["user_id"],
        request.match_info["post_id"],
        _limit(request),
        _continuation(request),
        reader=await _reader(request),
    )
    return json_response(
        {"items": page.items, "continuation": page.continuation, "newest": page.newest}
    )


OPERATIONS = [
    Operation("POST", "/users/{user_id}/reposts", create_repost,
              "Repost a post to one's followers (idempotent: a second repost of the same post "
              "is the first; the post must exist)", status=202,
              request=schemas.RepostRequest, response=schemas.RepostOut, auth=True,
              errors=(404, 429)),
    Operation("DELETE", "/users/{user_id}/reposts/{post_id}", delete_repost,
              "Undo one's repost of a post (idempotent; its entries are removed from "
              "followers' timelines asynchronously)", status=204, auth=True, errors=(429,)),
    Operation("GET", "/users/{user_id}/posts/{post_id}/replies", list_replies,
              "A post's replies, newest first (followers-only ones to followers)",
              response=schemas.PostPage, paged=True, errors=(404,), optional_auth=True),
]  # fmt: skip
