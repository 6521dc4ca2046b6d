"""Lists: handlers and their routes (``LIST_OPERATIONS``, added to the route table by
``api.app``)."""

from __future__ import annotations

from aiohttp import web

from api import routes, schemas
from api.openapi import Operation
from api.responses import json_response


def _list(request: web.Request) -> tuple[str, str]:
    return request.match_info["user_id"], request.match_info["list_id"]


async def create_list(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    body = await routes._body(request, schemas.ListRequest)
    owner = request.match_info["user_id"]
    made = await routes._service(request).lists.create(actor, owner, body.title, body.exclusive)
    location = f"/users/{owner}/lists/{made['list_id']}"
    return json_response(made, status=201, headers={"Location": location})


async def get_lists(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).lists.lists(
        actor, request.match_info["user_id"], routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def get_list(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    return json_response(await routes._service(request).lists.get(actor, *_list(request)))


async def edit_list(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    body = await routes._body(request, schemas.ListEdit)
    changed = await routes._service(request).lists.update(
        actor, *_list(request), body.title, body.exclusive
    )
    return json_response(changed)


async def delete_list(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    await routes._service(request).lists.delete(actor, *_list(request))
    return web.Response(status=204)


async def add_member(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    member = request.match_info["member"]
    await routes._service(request).lists.add_member(actor, *_list(request), member)
    return web.Response(status=204)


async def remove_member(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    member = request.match_info["member"]
    await routes._service(request).lists.remove_member(actor, *_list(request), member)
    return web.Response(status=204)


async def get_members(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).lists.members(
        actor, *_list(request), routes._limit(request), routes._continuation(request)
    )
    return routes._page(page)


async def list_timeline(request: web.Request) -> web.Response:
    actor = await routes._actor(request)
    page = await routes._service(request).lists.timeline(
        actor, *_list(request), routes._limit(request), routes._continuation(request),
        routes._since(request),
    )  # fmt: skip
    return routes._post_page(page)


LIST_OPERATIONS = [
    Operation("POST", "/users/{user_id}/lists", create_list,
              "Create a list (private to its owner; at most TIMELINE_MAX_LISTS, default 100: "
              "409 too_many_lists)", status=201, request=schemas.ListRequest,
              response=schemas.ListOut, auth=True, errors=(404, 409, 429),
              headers={"Location": "the new list"}),
    Operation("GET", "/users/{user_id}/lists", get_lists,
              "The user's lists, by list id (private: others get 404)",
              response=schemas.ListPage, auth=True, paged=True, errors=(404,)),
    Operation("GET", "/users/{user_id}/lists/{list_id}", get_list,
              "One list (private: others get 404)", response=schemas.ListOut, auth=True,
              errors=(404,)),
    Operation("PATCH", "/users/{user_id}/lists/{list_id}", edit_list,
              "Rename a list or make it exclusive or not (takes effect on the next read)",
              request=schemas.ListEdit, response=schemas.ListOut, auth=True,
              errors=(404, 429)),
    Operation("DELETE", "/users/{user_id}/lists/{list_id}", delete_list,
              "Delete a list: gone at once; its timeline and memberships are removed "
              "asynchronously", status=204, auth=True, errors=(404, 429)),
    Operation("PUT", "/users/{user_id}/lists/{list_id}/members/{member}", add_member,
              "Add a member (idempotent; followed or not; 403 blocked either way; at most "
              "5,000: 409 too_many_members): their newest posts and reposts are backfilled",
              status=204, auth=True, errors=(404, 409, 429)),
    Operation("DELETE", "/users/{user_id}/lists/{list_id}/members/{member}", remove_member,
              "Remove a member (idempotent): their entries leave the list asynchronously",
              status=204, auth=True, errors=(404, 429)),
    Operation("GET", "/users/{user_id}/lists/{list_id}/members", get_members,
              "The list's members, by user id", response=schemas.EdgePage, auth=True,
              paged=True, errors=(404,)),
    Operation("GET", "/users/{user_id}/lists/{list_id}/timeline", list_timeline,
              "The list's timeline, newest first, as the home timeline's pages",
              response=schemas.PostPage, auth=True, paged=True, since=True, errors=(404,)),
]  # fmt: skip
