"""Follows and follow requests: handlers and their routes (``FOLLOW_OPERATIONS``, added to the
route table by ``api.app``)."""

from __future__ import annotations

from aiohttp import web

from api import reposts, routes, schemas
from api.openapi import Operation
from api.responses import json_response


def _pair(request: web.Request) -> tuple[str, str]:
    return request.match_info["user_id"], request.match_info["target"]


async def follow(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    following = await routes._service(request).follows.follow(
        actor, *_pair(request), reposts=reposts.reposts_choice(request)
    )
    if following:
        return web.Response(status=204)
    return json_response({"state": "requested"}, status=202)


async def unfollow(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).follows.unfollow(actor, *_pair(request))
    return web.Response(status=204)


async def list_followers(request: web.Request) -> web.Response:
    page = await routes._service(request).follows.followers(
        request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def list_following(request: web.Request) -> web.Response:
    page = await routes._service(request).follows.following(
        request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def list_requests(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).follows.requests(
        actor, request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def approve(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).follows.approve(actor, *_pair(request))
    return web.Response(status=204)


async def refuse(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).follows.refuse(actor, *_pair(request))
    return web.Response(status=204)


FOLLOW_OPERATIONS = [
    Operation("PUT", "/users/{user_id}/following/{target}", follow,
              "Follow a user (idempotent; their recent posts are backfilled); a locked user "
              "gets a request instead (202), and the follow starts when it approves",
              status=204, auth=True, errors=(403, 404, 429), query=(reposts.REPOSTS_PARAMETER,),
              other_success=((202, "a request: the user is locked", schemas.FollowRequested),)),
    Operation("DELETE", "/users/{user_id}/following/{target}", unfollow,
              "Unfollow a user, or withdraw a request to (idempotent; their posts are purged)",
              status=204, auth=True, errors=(404, 429)),
    Operation("GET", "/users/{user_id}/followers", list_followers, "Who follows the user",
              response=schemas.EdgePage, paged=True, errors=(404,)),
    Operation("GET", "/users/{user_id}/following", list_following, "Whom the user follows",
              response=schemas.EdgePage, paged=True, errors=(404,)),
    Operation("GET", "/users/{user_id}/follow_requests", list_requests,
              "Requests to follow the user, waiting for its answer (private)",
              response=schemas.EdgePage, auth=True, paged=True),
    Operation("PUT", "/users/{user_id}/follow_requests/{target}", approve,
              "Approve a request: the follow starts, with its backfill (404 "
              "follow_request_not_found when it was withdrawn or refused)", status=204,
              auth=True, errors=(404, 429)),
    Operation("DELETE", "/users/{user_id}/follow_requests/{target}", refuse,
              "Refuse a request (idempotent)", status=204, auth=True, errors=(429,)),
]  # fmt: skip
