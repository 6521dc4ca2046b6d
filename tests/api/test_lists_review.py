"""Lists through the API against what a sceptical review tried (issue 31): what anyone can
learn of another user's private lists, and how the docs group the list routes."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from api import schemas
from api.app import openapi_document
from tests.conftest import unique
from tests.helpers import Api, bearer, body_of

Client = TestClient[Any, Any]


async def test_a_followers_page_shows_nothing_of_the_lists_a_user_is_in(client: Client) -> None:
    """A membership is a row in the member's ``subjectFollowers`` partition, keyed by the
    list's reader id ``{owner}~{list_id}``, among the followers. ``followers_page`` drops it
    after the query, so the anonymous followers listing gets a short (here empty) page with a
    continuation where it sits: anyone can tell that the user is in someone's private list,
    and, from the neighbouring follower ids (an attacker can follow with ids it chooses),
    narrow down the owner's id. A page that is empty while followers follow also shows
    "Nobody follows you yet" in the web client (``profile.js`` hides "more" on an empty
    first page)."""
    api = Api(client)
    member = unique("member")
    owner = unique("owner")
    fan = unique("zfan")  # sorts after ``{owner}~{list_id}``
    member_token = await api.register(member)
    owner_token = await api.register(owner)
    fan_token = await api.register(fan)
    await api.follow(fan, fan_token, member)
    response = await client.post(
        f"/users/{owner}/lists", json={"title": "secret"}, headers=bearer(owner_token)
    )
    list_id = (await body_of(response, schemas.ListOut))["list_id"]
    path = f"/users/{owner}/lists/{list_id}/members/{member}"
    assert (await client.put(path, headers=bearer(owner_token))).status == 204
    assert member_token

    first = await body_of(
        await client.get(f"/users/{member}/followers", params={"limit": "1"}), schemas.EdgePage
    )
    assert [item["user_id"] for item in first["items"]] == [fan], (
        f"an anonymous followers page shows a hidden row where the list sits: {first}"
    )


def test_list_routes_are_grouped_as_lists_in_the_docs() -> None:
    """``api.openapi_tags`` has no ``lists`` group: ``tag_of`` files the list timeline under
    "timeline" (the home timeline's group) and every other list route under "accounts";
    nor do ``list_id`` and ``member`` get path examples
    (``test_path_examples_are_real_ids_that_match_their_patterns`` fails)."""
    document = openapi_document(250, 280)
    tags = {
        path: operation["tags"][0]
        for path, operations in document["paths"].items()
        for operation in operations.values()
        if "/lists" in path
    }
    assert tags
    assert set(tags.values()) == {"lists"}, tags
