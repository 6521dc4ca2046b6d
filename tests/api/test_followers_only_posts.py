"""Followers-only posts: they reach followers' timelines only, and every read (a single post,
an author's page, a replies page, a home page, a stream) shows them only to the author and
to current followers; they cannot be reposted."""

from __future__ import annotations

import base64
from typing import Any

from aiohttp.test_utils import TestClient

from api import schemas
from fanout_worker.worker import Worker
from tests.conftest import eventually, unique
from tests.delivery.helpers import timeline_ids
from tests.helpers import Api, bearer, body_of, error_of
from timeline.model.keys import post_row_key
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


async def _post(client: Client, user: str, token: str, text: str, **body: Any) -> dict[str, Any]:
    response = await client.post(
        f"/users/{user}/posts", json={"text": text, **body}, headers=bearer(token)
    )
    assert response.status == 202, await response.text()
    data: dict[str, Any] = await body_of(response, schemas.PostOut)
    return data


async def _ids(client: Client, path: str, token: str | None) -> list[str]:
    headers = {} if token is None else bearer(token)
    page = await body_of(await client.get(path, headers=headers), schemas.PostPage)
    return [item["post_id"] for item in page["items"]]


async def test_a_followers_only_post_is_seen_by_its_author_and_followers_only(
    api: Api, client: Client, repos: Repositories, worker: Worker
) -> None:
    names = [unique(prefix) for prefix in ("author", "fan", "stranger")]
    (author, ta), (fan, tf), (stranger, ts) = [(n, await api.register(n)) for n in names]
    await api.follow(fan, tf, author)
    public = await _post(client, author, ta, "for everyone")
    private = await _post(client, author, ta, "for my followers", visibility="followers")
    assert (public["visibility"], private["visibility"]) == ("public", "followers")

    async def delivered() -> bool:
        return private["post_id"] in await timeline_ids(repos, fan)

    await eventually(delivered, what="the followers-only post in the follower's timeline")
    [entry] = [
        item
        for item in (await api.timeline(fan, tf))["items"]
        if item["post_id"] == private["post_id"]
    ]
    assert entry["visibility"] == "followers"
    path = f"/users/{author}/posts/{private['post_id']}"
    for token in (ta, tf):
        assert (await client.get(path, headers=bearer(token))).status == 200
    for headers in ({}, bearer(ts)):
        assert await error_of(await client.get(path, headers=headers), 404) == "post_not_found"
    page = f"/users/{author}/posts"
    both = [private["post_id"], public["post_id"]]
    assert await _ids(client, page, ta) == both
    assert await _ids(client, page, tf) == both
    assert await _ids(client, page, ts) == [public["post_id"]]
    assert await _ids(client, page, None) == [public["post_id"]]
    response = await client.post(
        f"/users/{fan}/reposts", json={"author": author, "post_id": private["post_id"]},
        headers=bearer(tf),
    )  # fmt: skip
    assert await error_of(response, 403) == "not_repostable"
    response = await client.post(
        f"/users/{stranger}/reposts", json={"author": author, "post_id": private["post_id"]},
        headers=bearer(ts),
    )  # fmt: skip
    assert await error_of(response, 404) == "post_not_found"
    reply = {"reply_to": {"author": author, "post_id": private["post_id"]}}
    response = await client.post(
        f"/users/{stranger}/posts", json={"text": "hi", **reply}, headers=bearer(ts)
    )
    assert await error_of(response, 404) == "reply_target_not_found"
    response = await client.get(f"{path}/replies", headers=bearer(ts))
    assert await error_of(response, 404) == "post_not_found"

    await api.unfollow(fan, tf, author)  # at once, before any purge: none of them shows
    assert private["post_id"] not in await api.timeline_ids(fan, tf)
    assert await error_of(await client.get(path, headers=bearer(tf)), 404) == "post_not_found"
    assert await _ids(client, page, tf) == [public["post_id"]]


async def test_a_followers_only_reply_shows_on_a_replies_page_to_followers_only(
    api: Api, client: Client
) -> None:
    names = [unique(prefix) for prefix in ("author", "replier", "fan", "stranger")]
    (author, ta), (replier, tr), (fan, tf), (_, ts) = [(n, await api.register(n)) for n in names]
    await api.follow(fan, tf, replier)
    original = await _post(client, author, ta, "a public question")
    reply_to = {"author": author, "post_id": original["post_id"]}
    private = await _post(client, replier, tr, "for my followers", reply_to=reply_to,
                          visibility="followers")  # fmt: skip
    public = await _post(client, replier, tr, "for all", reply_to=reply_to)
    path = f"/users/{author}/posts/{original['post_id']}/replies"
    both = [public["post_id"], private["post_id"]]
    assert await _ids(client, path, tf) == both
    assert await _ids(client, path, tr) == both
    assert await _ids(client, path, ts) == [public["post_id"]]
    assert await _ids(client, path, None) == [public["post_id"]]
    assert await _ids(client, path, ta) == [public["post_id"]]  # the author replied to too


async def test_bad_visibility_is_a_400(api: Api, client: Client) -> None:
    user = unique("me")
    token = await api.register(user)
    for visibility in ("private", "", None, 1):
        response = await client.post(f"/users/{user}/posts",
                                     json={"text": "x", "visibility": visibility},
                                     headers=bearer(token))  # fmt: skip
        assert await error_of(response, 400) == "invalid_body", visibility
    assert await _ids(client, f"/users/{user}/posts", token) == []


async def test_routes_that_take_an_optional_token_say_so(api: Api, client: Client) -> None:
    spec = await body_of(await client.get("/openapi.json"))
    for path in ("/users/{user_id}/posts", "/users/{user_id}/posts/{post_id}",
                 "/users/{user_id}/posts/{post_id}/replies"):  # fmt: skip
        described = spec["paths"][path]["get"]
        assert described["security"] == [{}, {"bearer": []}], path
        assert "401" in described["responses"], path
    user = unique("me")
    await api.register(user)
    response = await client.get(f"/users/{user}/posts", headers=bearer("not-a-token"))
    assert await error_of(response, 401) == "invalid_token"


async def test_a_continuation_tells_nobody_which_row_comes_next(api: Api, client: Client) -> None:
    """A page's continuation names the next stored row, which may be a followers-only post
    the reader may not see: it is encrypted, and the pages still go on to the end."""
    author = unique("author")
    token = await api.register(author)
    older = await _post(client, author, token, "public, older")
    hidden = await _post(client, author, token, "followers only", visibility="followers")
    newer = await _post(client, author, token, "public, newer")
    seen: list[str] = []
    continuation: str | None = None
    while True:
        query = {"limit": "1"} | ({"continuation": continuation} if continuation else {})
        page = await body_of(await client.get(f"/users/{author}/posts", params=query))
        seen += [item["post_id"] for item in page["items"]]
        continuation = page["continuation"]
        if continuation is None:
            break
        raw = b"".join(
            base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
            for part in continuation.split(".")
        )
        key = post_row_key(hidden["post_id"]).encode()
        spellings = {key, base64.b64encode(key).rstrip(b"="), base64.urlsafe_b64encode(key)}
        assert not any(spelling[:24] in raw for spelling in spellings)  # storage's form too
    assert seen == [newer["post_id"], older["post_id"]]
