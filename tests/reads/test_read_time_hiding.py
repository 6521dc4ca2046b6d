"""Read-time hiding: a reader's keyword filters hide matching entries from its home timeline
and stream at once, until deleted or expired (pages stay full; bad requests are clear 4xx),
and a stream leaves out followers-only posts of authors the reader does not follow."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp.test_utils import TestClient

from api import schemas
from tests.conftest import unique
from tests.delivery.helpers import unlimited_service
from tests.delivery.hybrid_helpers import new_users
from tests.helpers import Api, bearer, body_of, error_of, put_copies
from tests.reads.conftest import Live
from tests.reads.test_since_and_stream import _events
from timeline.model.entities import FOLLOWERS, Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.service.operations import TimelineService
from timeline.storage.accounts import Storage
from timeline.tables.relations import MAX_FILTERS, RelationsRepository
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


async def _home(service: TimelineService, reader: str, limit: int = 250) -> list[list[str]]:
    pages: list[list[str]] = []
    continuation: str | None = None
    while True:
        page = await service.timelines.home(reader, reader, limit, continuation)
        pages.append([item["post_id"] for item in page.items])
        continuation = page.continuation
        if continuation is None:
            return pages


def _flat(pages: list[list[str]]) -> list[str]:
    return [post for page in pages for post in page]


async def _entries(storage: Storage, reader: str, author: str, texts: list[str]) -> list[str]:
    """Copies of posts with these texts on the reader's timeline, newest first."""
    base = now_ticks()
    posts = [Post(new_post_id(base - i * 1000), author, text) for i, text in enumerate(texts)]
    await put_copies(storage, reader, posts)
    return [post.post_id for post in posts]


async def test_a_filter_hides_whole_words_at_once_and_its_delete_restores(
    storage: Storage, repos: Repositories
) -> None:
    reader, friend = await new_users(repos, "reader", "friend")
    texts = ["Cat!", "concatenate", "a CAT nap", "dogs", "cats"]
    ids = await _entries(storage, reader, friend, texts)
    service = unlimited_service(storage)
    found = await service.relations.add_filter(reader, reader, "  cat ", None)
    assert found["phrase"] == "cat"
    assert _flat(await _home(service, reader)) == [ids[1], ids[3], ids[4]]
    await service.relations.delete_filter(reader, reader, found["filter_id"])
    assert _flat(await _home(service, reader)) == ids


async def test_filtered_pages_stay_full_and_continue_right(
    storage: Storage, repos: Repositories
) -> None:
    reader, friend = await new_users(repos, "reader", "friend")
    texts = ["spoiler alert" if i % 4 else f"plain {i}" for i in range(40)]  # 3 in 4 hidden
    ids = await _entries(storage, reader, friend, texts)
    service = unlimited_service(storage)
    await service.relations.add_filter(reader, reader, "SPOILER", None)
    visible = [post for post, text in zip(ids, texts, strict=True) if text.startswith("plain")]
    pages = await _home(service, reader, limit=3)
    assert _flat(pages) == visible
    assert [len(page) for page in pages[:-1]] == [3] * (len(pages) - 1)


async def test_a_filter_applies_until_its_expiry_and_loads_in_the_one_query(
    storage: Storage, repos: Repositories
) -> None:
    reader = unique("reader")
    relations = RelationsRepository(storage)
    ends = time.time() + 60
    await relations.add_filter(reader, "soon", ends)
    await relations.mute(reader, unique("loud"), None, True)
    hidden, queries = await relations.hidden(reader, now=ends - 1)
    assert hidden.hides("someone", None, "Soon!")
    assert queries == 1
    hidden, _ = await relations.hidden(reader, now=ends)
    assert not hidden.hides("someone", None, "Soon!")


async def test_a_stream_leaves_out_filtered_posts(live: Live) -> None:
    reader, friend = await live.user("reader"), await live.user("friend")
    await live.api.follow(reader, live.tokens[reader], friend)
    response = await live.client.post(
        f"/users/{reader}/filters", json={"phrase": "spoiler"}, headers=bearer(live.tokens[reader])
    )
    assert response.status == 201
    stream = await live.stream(reader)
    await live.post(friend, "the SPOILER is")
    shown = await live.post(friend, "no surprises")
    assert [event["data"]["post_id"] for event in await _events(stream, 1)] == [shown]
    stream.close()


async def test_filters_through_the_api(client: Client) -> None:
    api = Api(client)
    user, other = unique("owner"), unique("other")
    token, other_token = await api.register(user), await api.register(other)
    path = f"/users/{user}/filters"
    ends = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    response = await client.post(path, json={"phrase": "Spoiler", "expires_at": ends},
                                  headers=bearer(token))  # fmt: skip
    created = await body_of(response, schemas.FilterOut)
    assert response.status == 201
    assert response.headers["Location"] == f"{path}/{created['filter_id']}"
    assert created["phrase"] == "Spoiler"
    listed = await body_of(await client.get(path, headers=bearer(token)), schemas.FilterPage)
    assert listed["items"] == [created]
    for method, url in (
        ("GET", path),
        ("POST", path),
        ("DELETE", f"{path}/{created['filter_id']}"),
    ):
        response = await client.request(
            method, url, json={"phrase": "x"}, headers=bearer(other_token)
        )
        assert await error_of(response, 403) == "forbidden", method
    response = await client.delete(f"{path}/{created['filter_id']}", headers=bearer(token))
    assert response.status == 204
    response = await client.delete(f"{path}/{created['filter_id']}", headers=bearer(token))
    assert await error_of(response, 404) == "filter_not_found"
    response = await client.delete(f"{path}/not-an-id", headers=bearer(token))
    assert await error_of(response, 400) == "invalid_filter_id"
    for body, code in (
        ({"phrase": "   "}, "invalid_phrase"),
        ({"phrase": "x" * 101}, "invalid_phrase"),
        ({"phrase": "a\u0000b"}, "invalid_phrase"),
        ({"phrase": "one two three four five six seven eight nine"}, "invalid_phrase"),
        ({"phrase": 7}, "invalid_body"),
        ({}, "invalid_body"),
        ({"phrase": "x", "expires_at": "2001-01-01T00:00:00Z"}, "invalid_expiry"),
        ({"phrase": "x", "expires_at": "tomorrow"}, "invalid_expiry"),
    ):
        response = await client.post(path, json=body, headers=bearer(token))
        assert await error_of(response, 400) == code, body


async def test_filters_past_the_cap_are_refused_even_when_made_at_once(
    client: Client, repos: Repositories
) -> None:
    """Each filter takes one of the owner's slots with an insert: however many creations
    race, at most ``MAX_FILTERS`` succeed, and one more after that is a 409."""
    api = Api(client)
    user = unique("owner")
    token = await api.register(user)
    made = await asyncio.gather(
        *(repos.relations.add_filter(user, f"word{n}", None) for n in range(MAX_FILTERS + 20))
    )
    assert sum(found is not None for found in made) == MAX_FILTERS
    ids = {found.filter_id for found in made if found is not None}
    assert len(ids) == MAX_FILTERS
    response = await client.post(f"/users/{user}/filters", json={"phrase": "one more"},
                                 headers=bearer(token))  # fmt: skip
    assert await error_of(response, 409) == "too_many_filters"
    listed = await body_of(
        await client.get(f"/users/{user}/filters?limit=250", headers=bearer(token)),
        schemas.FilterPage,
    )
    assert {item["filter_id"] for item in listed["items"]} == ids
    one = next(iter(ids))
    assert (
        await client.delete(f"/users/{user}/filters/{one}", headers=bearer(token))
    ).status == 204
    response = await client.post(f"/users/{user}/filters", json={"phrase": "now it fits"},
                                 headers=bearer(token))  # fmt: skip
    assert response.status == 201
    stale = await client.delete(f"/users/{user}/filters/{one}", headers=bearer(token))
    assert await error_of(stale, 404) == "filter_not_found"  # its slot holds another now


async def test_a_stream_leaves_out_followers_only_posts_of_an_author_no_longer_followed(
    live: Live,
) -> None:
    reader, author = await live.user("reader"), await live.user("author")
    stream = await live.stream(reader)
    base = now_ticks()
    late = Post(new_post_id(base), author, "a late copy", visibility=FOLLOWERS)
    shown = Post(new_post_id(base + 1), author, "a public copy")
    await put_copies(live.storage, reader, [late, shown])  # not followed: say purged late
    assert [event["data"]["post_id"] for event in await _events(stream, 1)] == [shown.post_id]
    stream.close()


async def test_a_stream_leaves_out_an_exclusive_lists_members(live: Live) -> None:
    reader, member, friend = [await live.user(name) for name in ("reader", "member", "friend")]
    token = live.tokens[reader]
    for followed in (member, friend):
        await live.api.follow(reader, token, followed)
    made = await live.client.post(
        f"/users/{reader}/lists", json={"title": "news", "exclusive": True}, headers=bearer(token)
    )
    list_id = (await body_of(made, schemas.ListOut))["list_id"]
    path = f"/users/{reader}/lists/{list_id}/members/{member}"
    assert (await live.client.put(path, headers=bearer(token))).status == 204
    stream = await live.stream(reader)
    await live.post(member, "in the list only")
    shown = await live.post(friend, "at home")
    assert [event["data"]["post_id"] for event in await _events(stream, 1)] == [shown]
    stream.close()
