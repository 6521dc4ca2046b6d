"""Deleting an account through the API: at once its tokens are refused, its profile is a 404
and its id (in any spelling, by any replay) cannot be registered again; only its owner may
delete it; others can no longer act on it, and reads naming it never fail."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from api import schemas
from fanout_worker.worker import Worker
from tests.conftest import eventually, unique
from tests.helpers import Api, bearer, body_of, error_of

Client = TestClient[Any, Any]


async def test_a_deleted_account_is_gone_at_once_and_its_id_stays_taken(client: Client) -> None:
    api = Api(client)
    user, other = unique("Del"), unique("other")
    token, other_token = await api.register(user), await api.register(other)
    deleted = await client.delete(f"/users/{user}", headers=bearer(token))
    assert deleted.status == 202
    assert await body_of(deleted, schemas.AccountDeleting) == {"user_id": user, "state": "deleting"}
    assert await error_of(await client.get(f"/users/{user}"), 404) == "user_not_found"
    post = await client.post(f"/users/{user}/posts", json={"text": "hi"}, headers=bearer(token))
    assert await error_of(post, 401) == "revoked_token"
    again = await client.delete(f"/users/{user}", headers=bearer(token))
    assert again.status == 401
    for spelling in (user, user.lower(), user.upper()):
        registered = await client.post("/users", json={"user_id": spelling})
        assert await error_of(registered, 409) == "user_exists"
    follow = await client.put(f"/users/{other}/following/{user}", headers=bearer(other_token))
    assert await error_of(follow, 404) == "user_not_found"


async def test_only_the_owner_deletes_an_account(client: Client) -> None:
    api = Api(client)
    user, other = unique("owner"), unique("other")
    await api.register(user)
    other_token = await api.register(other)
    assert await error_of(await client.delete(f"/users/{user}"), 401) == "missing_token"
    answer = await client.delete(f"/users/{user}", headers=bearer(other_token))
    assert await error_of(answer, 403) == "forbidden"
    assert (await api.profile(user))["user_id"] == user


async def _deleted(client: Client, user: str, token: str) -> None:
    response = await client.delete(f"/users/{user}", headers=bearer(token))
    assert response.status == 202, await response.text()


async def test_a_replayed_registration_after_deletion_gets_no_token(client: Client) -> None:
    user, key = unique("del"), unique("key")
    first = await client.post("/users", json={"user_id": user}, headers={"Idempotency-Key": key})
    assert first.status == 201
    await _deleted(client, user, (await first.json())["token"])
    again = await client.post("/users", json={"user_id": user}, headers={"Idempotency-Key": key})
    assert again.status == 409, await again.text()


async def test_others_cannot_act_on_a_deleted_account(client: Client) -> None:
    api = Api(client)
    gone, other = unique("gone"), unique("other")
    gone_token, token = await api.register(gone), await api.register(other)
    await _deleted(client, gone, gone_token)
    follow = await client.put(f"/users/{other}/following/{gone}", headers=bearer(token))
    assert follow.status == 404, await follow.text()
    block = await client.put(f"/users/{other}/blocks/{gone}", headers=bearer(token))
    assert block.status == 404, await block.text()


async def test_reads_touching_a_deleted_account_before_the_worker_ran(client: Client) -> None:
    """Between the DELETE and the worker's sweep: every read naming the account, or listing
    it, answers without a 5xx."""
    api = Api(client)
    gone, other = unique("gone"), unique("other")
    gone_token, token = await api.register(gone), await api.register(other)
    await api.follow(other, token, gone)
    await api.follow(gone, gone_token, other)
    post = await api.post(gone, gone_token, "hello")
    reply = await client.post(
        f"/users/{other}/posts",
        json={"text": "hi", "reply_to": {"author": gone, "post_id": post["post_id"]}},
        headers=bearer(token),
    )
    created = await client.post(
        f"/users/{gone}/lists", json={"title": "l"}, headers=bearer(gone_token)
    )
    list_id = (await created.json()).get("list_id", "0" * 19)
    await _deleted(client, gone, gone_token)
    paths = [
        f"/users/{gone}/{path}"
        for path in ("posts", "followers", "following", "lists", f"lists/{list_id}",
                     f"lists/{list_id}/members", f"posts/{post['post_id']}",
                     f"posts/{post['post_id']}/replies")
    ] + [f"/users/{other}/{path}" for path in ("followers", "following", "timeline")]  # fmt: skip
    for path in paths:
        response = await client.get(path, headers=bearer(token))
        assert response.status < 500, (path, response.status, await response.text())
    assert reply.status in (202, 404), await reply.text()


async def test_a_reply_to_a_deleted_account_answers_nobody(
    api: Api, client: Client, worker: Worker
) -> None:
    """Others' replies stay, answering nobody (``reply_to.author`` null, as the schema says);
    a new reply to the account's post is refused at once."""
    gone, other = unique("gone"), unique("other")
    gone_token, token = await api.register(gone), await api.register(other)
    post = await api.post(gone, gone_token, "hello")
    to_post = {"author": gone, "post_id": post["post_id"]}
    answered = await client.post(
        f"/users/{other}/posts", json={"text": "hi", "reply_to": to_post}, headers=bearer(token)
    )
    reply = await body_of(answered, schemas.PostOut)
    assert reply["reply_to"] == to_post
    await _deleted(client, gone, gone_token)
    late = await client.post(
        f"/users/{other}/posts", json={"text": "late", "reply_to": to_post}, headers=bearer(token)
    )
    assert await error_of(late, 404) == "reply_target_not_found"
    path = f"/users/{other}/posts/{reply['post_id']}"

    async def detached() -> bool:
        shown = await body_of(await client.get(path, headers=bearer(token)), schemas.PostOut)
        return bool(shown["reply_to"] == {"author": None, "post_id": post["post_id"]})

    await eventually(detached, what="the reply to answer nobody")
    page = await body_of(await client.get(f"/users/{other}/posts", headers=bearer(token)))
    assert [item["reply_to"] for item in page["items"]] == [
        {"author": None, "post_id": post["post_id"]}
    ]
