"""Look-alike identities: ids unique ignoring case, invisible format characters refused."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import unique
from tests.helpers import Api, bearer, error_of

Client = TestClient[Any, Any]
INVISIBLE = ["\u202e", "\u200b", "\u200e", "\u2066", "\u2069", "\ufeff", "\u00ad", "\u2060"]


def _mixed_case(prefix: str) -> str:
    return unique(prefix).capitalize()


async def test_an_id_differing_only_in_case_is_taken(client: Client) -> None:
    carol = _mixed_case("Carol")
    await Api(client).register(carol)
    response = await client.post("/users", json={"user_id": carol.lower()})
    assert await error_of(response, 409) == "user_exists"
    assert carol in (await response.json())["error"]["message"]
    response = await client.post("/users", json={"user_id": carol.upper()})
    assert await error_of(response, 409) == "user_exists"


async def test_a_retried_registration_still_succeeds(client: Client) -> None:
    """The identity row the first attempt wrote names the same spelling: the retry with the
    same idempotency key gets its token."""
    carol = _mixed_case("Carol")
    first = await client.post("/users", json={"user_id": carol}, headers={"Idempotency-Key": "k"})
    again = await client.post("/users", json={"user_id": carol}, headers={"Idempotency-Key": "k"})
    assert (first.status, again.status) == (201, 201)


async def test_another_case_is_a_404_on_every_route(client: Client) -> None:
    """Ids are matched exactly: a spelling nobody registered names nobody."""
    api = Api(client)
    carol, dave = _mixed_case("Carol"), unique("dave")
    carol_token, dave_token = await api.register(carol), await api.register(dave)
    await api.post(carol, carol_token, "hello")
    other = carol.lower()
    for path in ("", "/posts", "/followers", "/following"):
        assert await error_of(await client.get(f"/users/{other}{path}"), 404) == "user_not_found"
    for method in ("PUT", "DELETE"):
        response = await client.request(
            method, f"/users/{dave}/following/{other}", headers=bearer(dave_token)
        )
        assert await error_of(response, 404) == "user_not_found", method
    # acting on another spelling than the token's is acting as someone else: 403, as for
    # any id, so a token never learns whether an id exists
    response = await client.post(
        f"/users/{other}/posts", json={"text": "x"}, headers=bearer(carol_token)
    )
    assert await error_of(response, 403) == "forbidden"


@pytest.mark.parametrize("character", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
async def test_invisible_characters_are_refused_in_ids_and_display_names(
    client: Client, character: str
) -> None:
    name = f"caro{character}l"
    response = await client.post("/users", json={"user_id": name})
    assert await error_of(response, 400) == "invalid_user_id"
    response = await client.post("/users", json={"user_id": unique(), "display_name": name})
    assert await error_of(response, 400) == "invalid_display_name"
    assert f"U+{ord(character):04X}" in (await response.json())["error"]["message"]


@pytest.mark.parametrize("character", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
async def test_invisible_characters_are_refused_in_posts(client: Client, character: str) -> None:
    me = unique()
    token = await Api(client).register(me)
    response = await client.post(
        f"/users/{me}/posts", json={"text": f"gnp.{character}exe"}, headers=bearer(token)
    )
    assert await error_of(response, 400) == "invalid_text"


async def test_joiners_and_flag_tags_stay_in_posts(client: Client) -> None:
    """Emoji sequences and scripts that need the zero-width (non-)joiner, and subdivision
    flags made of tag characters, are posted as typed."""
    me = unique()
    token = await Api(client).register(me)
    for text in (
        "👩\u200d👩\u200d👧",
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian: "I want"
        "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    ):
        post = await Api(client).post(me, token, text)
        assert post["text"] == text


async def test_bad_limits_say_what_is_allowed(client: Client) -> None:
    me = unique()
    await Api(client).register(me)
    for limit in ("-1", "0", "251", "+999", "abc", "1.5"):
        response = await client.get(f"/users/{me}/posts", params={"limit": limit})
        assert await error_of(response, 400) == "invalid_limit"
        message = (await response.json())["error"]["message"]
        assert "between 1 and 250" in message, (limit, message)


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"[" * 5000 + b"]" * 5000, "nests deeper than 1024 levels"),
        (b'{"text": 1e999}', "number too large"),
        (b'{"text": "\xff"}', "not valid UTF-8"),
        (b'{"text": "unterminated', "not valid JSON"),
    ],
    ids=["deep", "huge-number", "utf8", "truncated"],
)
async def test_a_bad_json_body_says_what_is_wrong(client: Client, raw: bytes, says: str) -> None:
    me = unique()
    token = await Api(client).register(me)
    response = await client.post(
        f"/users/{me}/posts",
        data=raw,
        headers={"Content-Type": "application/json"} | bearer(token),
    )
    assert await error_of(response, 400) == "invalid_json"
    message = (await response.json())["error"]["message"]
    assert says in message
    if says != "not valid UTF-8":
        assert "UTF-8" not in message


async def test_unfollow_answers_like_follow(client: Client) -> None:
    """An unknown subject is a 404 and oneself a 400, for DELETE as for PUT."""
    me = unique()
    token = await Api(client).register(me)
    for method in ("PUT", "DELETE"):
        unknown = await client.request(
            method, f"/users/{me}/following/{unique('nobody')}", headers=bearer(token)
        )
        assert await error_of(unknown, 404) == "user_not_found", method
        myself = await client.request(method, f"/users/{me}/following/{me}", headers=bearer(token))
        assert await error_of(myself, 400) == "self_follow", method
