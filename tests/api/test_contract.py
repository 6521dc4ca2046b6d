"""Every row of CONTRACT §3, success and error, against the app on a real Azurite."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from openapi_spec_validator import validate

from api import schemas
from tests.conftest import TEST_SECRET, api_client, make_settings, unique
from tests.helpers import Api, bearer, body_of, error_of
from timeline.config import Settings
from timeline.model.tokens import TokenSigner
from timeline.tables.repositories import Repositories

Client = TestClient[Any, Any]


# --- POST /users -------------------------------------------------------------------------


async def test_register_returns_token_and_profile(api: Api, client: Client) -> None:
    user = unique()
    response = await client.post("/users", json={"user_id": user, "display_name": " Ada "})
    assert response.status == 201
    assert response.headers["Location"] == f"/users/{user}"
    data = await body_of(response, schemas.Registered)
    assert data["user_id"] == user
    assert data["display_name"] == "Ada"
    assert await api.profile(user) == {
        "user_id": user, "display_name": "Ada", "locked": False, "followers": 0, "following": 0,
        "posts": 0,
    }  # fmt: skip


async def test_register_defaults_display_name_to_id(api: Api) -> None:
    user = unique()
    await api.register(user)
    assert (await api.profile(user))["display_name"] == user


async def test_register_existing_id_is_409(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user, "first")
    response = await client.post("/users", json={"user_id": user, "display_name": "second"})
    assert await error_of(response, 409) == "user_exists"
    assert (await api.profile(user))["display_name"] == "first"
    assert (await api.timeline(user, token))["items"] == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"user_id": "bad id"}, "invalid_user_id"),
        ({"user_id": "x" * 65}, "invalid_user_id"),
        ({"user_id": ""}, "invalid_user_id"),
        ({"user_id": "a'b"}, "invalid_user_id"),
        ({"user_id": 42}, "invalid_body"),
        ({}, "invalid_body"),
        ({"user_id": "ok", "admin": True}, "invalid_body"),
        ({"user_id": "ok-name", "display_name": "   "}, "invalid_display_name"),
        ({"user_id": "ok-name", "display_name": "x" * 65}, "invalid_display_name"),
        ([1, 2], "invalid_body"),
        ("text", "invalid_body"),
    ],
)
async def test_register_rejects_bad_bodies(client: Client, body: Any, code: str) -> None:
    response = await client.post("/users", json=body)
    assert await error_of(response, 400) == code


async def test_register_rejects_invalid_json(client: Client) -> None:
    for raw in (b"{", b'{"user_id": "\xff"}', b"", b'{"user_id": "\\ud800"}'):
        response = await client.post(
            "/users", data=raw, headers={"Content-Type": "application/json"}
        )
        assert await error_of(response, 400) == "invalid_json"


async def test_register_requires_json_content_type(client: Client) -> None:
    response = await client.post("/users", data="user_id=x", headers={"Content-Type": "text/plain"})
    assert await error_of(response, 415) == "unsupported_media_type"


async def test_oversized_body_is_413(client: Client, settings: Settings) -> None:
    padding = "x" * (settings.max_body_bytes + 1)
    response = await client.post("/users", json={"user_id": "big", "display_name": padding})
    assert await error_of(response, 413) == "body_too_large"


# --- GET /users/{id} ---------------------------------------------------------------------


async def test_unknown_user_is_404(client: Client) -> None:
    assert await error_of(await client.get(f"/users/{unique()}"), 404) == "user_not_found"


async def test_invalid_user_id_in_path_is_400(client: Client) -> None:
    for path in ("/users/a%27b", "/users/" + "x" * 65, "/users/a%00b", "/users/%C3%A9"):
        assert await error_of(await client.get(path), 400) == "invalid_user_id"


# --- POST /users/{id}/posts and authentication ---------------------------------------------


async def test_post_is_accepted_with_location(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user)
    response = await client.post(
        f"/users/{user}/posts", json={"text": "  hello  "}, headers=bearer(token)
    )
    assert response.status == 202
    post = await body_of(response, schemas.PostOut)
    assert post["text"] == "hello"
    assert post["author"] == user
    assert post["created_at"].endswith("Z")
    assert len(post["created_at"]) == 27
    assert response.headers["Location"] == f"/users/{user}/posts/{post['post_id']}"
    fetched = await client.get(response.headers["Location"])
    assert await body_of(fetched, schemas.PostOut) == post
    assert (await api.profile(user))["posts"] == 1


@pytest.mark.parametrize(
    ("text", "code"),
    [("", "invalid_text"), ("   \n ", "invalid_text"), ("x" * 281, "invalid_text"),
     ("a\x00b", "invalid_text"), (5, "invalid_body"), (None, "invalid_body")],
)  # fmt: skip
async def test_post_rejects_bad_text(api: Api, client: Client, text: Any, code: str) -> None:
    user = unique()
    token = await api.register(user)
    response = await client.post(f"/users/{user}/posts", json={"text": text}, headers=bearer(token))
    assert await error_of(response, 400) == code
    assert (await api.profile(user))["posts"] == 0


async def test_post_limit_counts_characters_not_bytes(api: Api) -> None:
    user = unique()
    token = await api.register(user)
    assert (await api.post(user, token, "🙂" * 280))["text"] == "🙂" * 280


async def test_authentication_failures_are_401(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user)
    url = f"/users/{user}/posts"
    forged = token.rsplit(".", 1)[0] + ".AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    cases = {
        "missing_token": {},
        "invalid_token": {"Authorization": f"Basic {token}"},
    }
    for expected, headers in cases.items():
        response = await client.post(url, json={"text": "x"}, headers=headers)
        assert await error_of(response, 401) == expected
        assert response.headers["WWW-Authenticate"] == "Bearer"
    response = await client.post(url, json={"text": "x"}, headers=bearer(forged))
    assert await error_of(response, 401) == "invalid_token"
    other_key = TokenSigner(b"another-key", token_ttl_s=60).mint_bearer(user)
    response = await client.post(url, json={"text": "x"}, headers=bearer(other_key))
    assert await error_of(response, 401) == "invalid_token"
    expired = TokenSigner(TEST_SECRET.encode(), token_ttl_s=60).mint_bearer(user, now=0)
    response = await client.post(url, json={"text": "x"}, headers=bearer(expired))
    assert await error_of(response, 401) == "expired_token"
    assert (await api.profile(user))["posts"] == 0


async def test_acting_as_someone_else_is_403(api: Api, client: Client) -> None:
    alice, bob = unique(), unique()
    alice_token = await api.register(alice)
    bob_token = await api.register(bob)
    response = await client.post(
        f"/users/{bob}/posts", json={"text": "hi"}, headers=bearer(alice_token)
    )
    assert await error_of(response, 403) == "forbidden"
    post = await api.post(bob, bob_token, "mine")
    response = await client.delete(
        f"/users/{bob}/posts/{post['post_id']}", headers=bearer(alice_token)
    )
    assert await error_of(response, 403) == "forbidden"
    response = await client.put(f"/users/{bob}/following/{alice}", headers=bearer(alice_token))
    assert await error_of(response, 403) == "forbidden"
    response = await client.delete(f"/users/{bob}/following/{alice}", headers=bearer(alice_token))
    assert await error_of(response, 403) == "forbidden"
    response = await client.get(f"/users/{bob}/timeline", headers=bearer(alice_token))
    assert await error_of(response, 403) == "forbidden"
    response = await client.get(f"/users/{bob}/timeline")
    assert await error_of(response, 401) == "missing_token"
    assert (await api.profile(bob))["posts"] == 1


async def test_rate_limit_is_429_with_retry_after(settings: Settings, storage: object) -> None:
    limited = make_settings(settings.connection_string(), settings.data_dir, posts_per_minute=2)
    async with api_client(limited) as client:
        api = Api(client)
        user = unique()
        token = await api.register(user)
        await api.post(user, token, "one")
        await api.post(user, token, "two")
        response = await client.post(
            f"/users/{user}/posts", json={"text": "three"}, headers=bearer(token)
        )
        assert await error_of(response, 429) == "rate_limited"
        assert 1 <= int(response.headers["Retry-After"]) <= 60
        assert (await api.profile(user))["posts"] == 2


# --- posts: list, get, delete ----------------------------------------------------------------


async def test_posts_page_newest_first_with_limit_and_continuation(
    api: Api, client: Client
) -> None:
    user = unique()
    token = await api.register(user)
    posted = [(await api.post(user, token, f"post {i}"))["post_id"] for i in range(5)]
    response = await client.get(f"/users/{user}/posts", params={"limit": "3"})
    first = await body_of(response, schemas.PostPage)
    assert [p["post_id"] for p in first["items"]] == posted[::-1][:3]
    assert first["continuation"]
    response = await client.get(
        f"/users/{user}/posts", params={"limit": "3", "continuation": first["continuation"]}
    )
    second = await body_of(response, schemas.PostPage)
    assert [p["post_id"] for p in second["items"]] == posted[::-1][3:]
    assert second["continuation"] is None


async def test_posts_of_unknown_user_is_404_and_empty_user_is_empty(
    api: Api, client: Client
) -> None:
    assert await error_of(await client.get(f"/users/{unique()}/posts"), 404) == "user_not_found"
    user = unique()
    await api.register(user)
    page = await body_of(await client.get(f"/users/{user}/posts"), schemas.PostPage)
    assert page == {"items": [], "continuation": None, "newest": None}


@pytest.mark.parametrize("limit", ["0", "251", "-1", "abc", "1.5", "", "99999999999"])
async def test_bad_limit_is_400(api: Api, client: Client, limit: str) -> None:
    user = unique()
    await api.register(user)
    response = await client.get(f"/users/{user}/posts", params={"limit": limit})
    assert await error_of(response, 400) == "invalid_limit"


async def test_tampered_or_foreign_continuation_is_400(api: Api, client: Client) -> None:
    alice, bob = unique(), unique()
    alice_token = await api.register(alice)
    bob_token = await api.register(bob)
    for token, user in ((alice_token, alice), (bob_token, bob)):
        for i in range(3):
            await api.post(user, token, f"p{i}")
    page = await body_of(
        await client.get(f"/users/{alice}/posts", params={"limit": "1"}), schemas.PostPage
    )
    good = page["continuation"]
    for bad in (good[:-2] + "xx", "garbage", good + "=", "a.b"):
        response = await client.get(f"/users/{alice}/posts", params={"continuation": bad})
        assert await error_of(response, 400) == "invalid_continuation"
    response = await client.get(f"/users/{bob}/posts", params={"continuation": good})
    assert await error_of(response, 400) == "invalid_continuation"


async def test_get_post_errors(api: Api, client: Client) -> None:
    user = unique()
    await api.register(user)
    missing = "0" * 26
    assert await error_of(await client.get(f"/users/{user}/posts/{missing}"), 404) == (
        "post_not_found"
    )
    assert await error_of(await client.get(f"/users/{user}/posts/nothex"), 400) == (
        "invalid_post_id"
    )


async def test_delete_post(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user)
    post = await api.post(user, token, "short-lived")
    url = f"/users/{user}/posts/{post['post_id']}"
    assert (await client.delete(url, headers=bearer(token))).status == 204
    assert await error_of(await client.get(url), 404) == "post_not_found"
    assert (await api.profile(user))["posts"] == 0
    assert await error_of(await client.delete(url, headers=bearer(token)), 404) == "post_not_found"


# --- follow / unfollow / followers / following -------------------------------------------


async def test_follow_is_idempotent_and_counted(api: Api, client: Client) -> None:
    alice, bob = unique(), unique()
    alice_token = await api.register(alice)
    await api.register(bob)
    await api.follow(alice, alice_token, bob)
    await api.follow(alice, alice_token, bob)
    assert (await api.profile(alice))["following"] == 1
    assert (await api.profile(bob))["followers"] == 1
    followers = await body_of(await client.get(f"/users/{bob}/followers"), schemas.EdgePage)
    assert [edge["user_id"] for edge in followers["items"]] == [alice]
    following = await body_of(await client.get(f"/users/{alice}/following"), schemas.EdgePage)
    assert [edge["user_id"] for edge in following["items"]] == [bob]
    assert following["items"][0]["since"] == followers["items"][0]["since"]

    await api.unfollow(alice, alice_token, bob)
    await api.unfollow(alice, alice_token, bob)
    assert (await api.profile(alice))["following"] == 0
    assert (await api.profile(bob))["followers"] == 0
    followers = await body_of(await client.get(f"/users/{bob}/followers"), schemas.EdgePage)
    assert followers["items"] == []


async def test_follow_errors(api: Api, client: Client) -> None:
    alice = unique()
    token = await api.register(alice)
    response = await client.put(f"/users/{alice}/following/{unique()}", headers=bearer(token))
    assert await error_of(response, 404) == "user_not_found"
    response = await client.put(f"/users/{alice}/following/{alice}", headers=bearer(token))
    assert await error_of(response, 400) == "self_follow"
    response = await client.put(f"/users/{alice}/following/bad%20id", headers=bearer(token))
    assert await error_of(response, 400) == "invalid_user_id"
    assert (await api.profile(alice))["following"] == 0


async def test_followers_paging(api: Api, client: Client, repos: Repositories) -> None:
    star = unique("star")
    await api.register(star)
    fans = sorted(unique("fan") for _ in range(5))
    for fan in fans:
        token = await api.register(fan)
        await api.follow(fan, token, star)
    seen: list[str] = []
    continuation = None
    while True:
        params = {"limit": "2"} | ({"continuation": continuation} if continuation else {})
        page = await body_of(
            await client.get(f"/users/{star}/followers", params=params), schemas.EdgePage
        )
        seen += [edge["user_id"] for edge in page["items"]]
        continuation = page["continuation"]
        if continuation is None:
            break
    assert seen == fans
    assert await error_of(await client.get(f"/users/{unique()}/following"), 404) == (
        "user_not_found"
    )


# --- operational routes ------------------------------------------------------------------


async def test_health_ready_metrics(client: Client) -> None:
    assert await body_of(await client.get("/healthz"), schemas.Status) == {"status": "ok"}
    assert await body_of(await client.get("/readyz"), schemas.Status) == {"status": "ready"}
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    assert "timeline_http_requests_total" in await response.text()


async def test_openapi_describes_every_route(client: Client) -> None:
    from api.app import OPERATIONS

    spec = await body_of(await client.get("/openapi.json"))
    validate(spec)
    described = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert described == {(op.method, op.path) for op in OPERATIONS}
    # markers (2), reposts (2), replies, blocks and mutes (6), filters (3), a profile's edit,
    # follow requests (3), lists (9)
    assert len(described) == 47
    assert {
        ("GET", "/users/{user_id}/markers/home"),
        ("PUT", "/users/{user_id}/markers/home"),
    } <= described


async def test_unknown_route_and_method_are_json_errors(client: Client) -> None:
    assert await error_of(await client.get("/nope"), 404) == "not_found"
    response = await client.patch("/users")
    assert await error_of(response, 405) == "method_not_allowed"


async def test_storage_outage_is_503_with_retry_after(tmp_path: Any) -> None:
    from timeline.tools.azurite import connection_string, free_ports

    dead = connection_string((free_ports(3)[0], free_ports(3)[1], free_ports(3)[2]))
    settings = make_settings(dead, tmp_path, storage_timeout_s=2.0)
    async with api_client(settings) as client:
        for request in (client.get("/users/someone"), client.get("/readyz"),
                        client.post("/users", json={"user_id": "someone"})):  # fmt: skip
            response = await request
            assert await error_of(response, 503) == "storage_unavailable"
            assert int(response.headers["Retry-After"]) >= 1
