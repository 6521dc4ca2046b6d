"""A catalogue of hostile requests: each gets a clear 4xx with an error code, and nothing a
victim owns changes (profile counters, posts, timeline)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import TEST_SECRET, unique
from tests.helpers import Api, bearer, error_of
from timeline.model.tokens import TokenSigner

Client = TestClient[Any, Any]
INJECTION = "x' or PartitionKey ne '"
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Bad:
    """``{me}`` in path or body is the victim, ``{other}`` a second user, ``{post}`` one of
    the victim's posts; ``auth`` picks the token: me, other, forged, expired or none."""

    method: str
    path: str
    status: int
    code: str
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    auth: str = "me"


CATALOGUE = [
    # ids in bodies
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "a b"}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "a/b"}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "a#b"}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "a?b"}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "a\\b"}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "a\u0001b"}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "x" * 65}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": INJECTION}, auth="none"),
    Bad("POST", "/users", 400, "invalid_user_id", {"user_id": "ünïcode"}, auth="none"),
    Bad("POST", "/users", 409, "user_exists", {"user_id": "{me}"}, auth="none"),
    # wrong JSON types, non-objects, malformed JSON, media type, size
    Bad("POST", "/users", 400, "invalid_body", {"user_id": 7}, auth="none"),
    Bad("POST", "/users", 400, "invalid_body", {"user_id": "ok", "display_name": 5}, auth="none"),
    Bad("POST", "/users", 400, "invalid_body", {"user_id": "ok", "is_admin": True}, auth="none"),
    Bad("POST", "/users", 400, "invalid_display_name", {"user_id": "okay", "display_name": "x" * 65}, auth="none"),  # noqa: E501
    Bad("POST", "/users/{me}/posts", 400, "invalid_body", [1, 2]),
    Bad("POST", "/users/{me}/posts", 400, "invalid_body", "text"),
    Bad("POST", "/users/{me}/posts", 400, "invalid_body", None, raw=b"null"),
    Bad("POST", "/users/{me}/posts", 400, "invalid_body", {"text": ["a"]}),
    Bad("POST", "/users/{me}/posts", 400, "invalid_json", raw=b'{"text": "\xff\xfe"}'),
    Bad("POST", "/users/{me}/posts", 400, "invalid_json", raw=b'{"text": "\\ud800"}'),
    Bad("POST", "/users/{me}/posts", 400, "invalid_json", raw=b'{"text": NaN}'),
    Bad("POST", "/users/{me}/posts", 400, "invalid_json", raw=b"[" * 2000 + b"]" * 2000),
    Bad("POST", "/users/{me}/posts", 400, "invalid_json", raw=b'{"text": "unterminated'),
    Bad("POST", "/users/{me}/posts", 415, "unsupported_media_type", raw=b"text=hi",
        headers={"Content-Type": "application/x-www-form-urlencoded"}),
    Bad("POST", "/users/{me}/posts", 413, "body_too_large", {"text": "x" * 20_000}),
    # post texts
    Bad("POST", "/users/{me}/posts", 400, "invalid_text", {"text": ""}),
    Bad("POST", "/users/{me}/posts", 400, "invalid_text", {"text": " \n\t "}),
    Bad("POST", "/users/{me}/posts", 400, "invalid_text", {"text": "x" * 281}),
    Bad("POST", "/users/{me}/posts", 400, "invalid_text", {"text": "nul\u0000byte"}),
    Bad("POST", "/users/{me}/posts", 400, "invalid_text", {"text": "esc\u001b[31m"}),
    # tokens
    Bad("POST", "/users/{me}/posts", 401, "missing_token", {"text": "hi"}, auth="none"),
    Bad("POST", "/users/{me}/posts", 401, "invalid_token", {"text": "hi"}, auth="forged"),
    Bad("POST", "/users/{me}/posts", 401, "expired_token", {"text": "hi"}, auth="expired"),
    Bad("POST", "/users/{me}/posts", 401, "invalid_token", {"text": "hi"}, auth="basic"),
    Bad("POST", "/users/{me}/posts", 403, "forbidden", {"text": "hi"}, auth="other"),
    Bad("DELETE", "/users/{me}/posts/{post}", 403, "forbidden", auth="other"),
    Bad("GET", "/users/{me}/timeline", 403, "forbidden", auth="other"),
    Bad("PUT", "/users/{me}/following/{other}", 403, "forbidden", auth="other"),
    Bad("DELETE", "/users/{me}/following/{other}", 401, "invalid_token", auth="forged"),
    # ids, injection and query parameters in URLs
    Bad("GET", "/users/x%27%20or%20PartitionKey%20ne%20%27", 400, "invalid_user_id", auth="none"),
    Bad("GET", "/users/{me}/posts/x%27%20or%20RowKey%20ne%20%27", 400, "invalid_post_id"),
    Bad("DELETE", "/users/{me}/posts/" + "0" * 26, 404, "post_not_found"),
    Bad("PUT", "/users/{me}/following/x%27%20or%20RowKey%20ne%20%27", 400, "invalid_user_id"),
    Bad("PUT", "/users/{me}/following/{me}", 400, "self_follow"),
    Bad("PUT", "/users/{me}/following/nobody-here-at-all", 404, "user_not_found"),
    Bad("DELETE", "/users/{me}/following/{me}", 400, "self_follow"),
    Bad("DELETE", "/users/{me}/following/nobody-here-at-all", 404, "user_not_found"),
    Bad("GET", "/users/{me}/timeline?limit=-1", 400, "invalid_limit"),
    Bad("POST", "/users", 400, "invalid_display_name", {"user_id": "okay", "display_name": "\u202eevil"}, auth="none"),  # noqa: E501
    Bad("POST", "/users/{me}/posts", 400, "invalid_text", {"text": "txt.\u202eexe"}),
    Bad("GET", "/users/{me}/timeline?limit=0", 400, "invalid_limit"),
    Bad("GET", "/users/{me}/timeline?limit=251", 400, "invalid_limit"),
    Bad("GET", "/users/{me}/timeline?limit=1e2", 400, "invalid_limit"),
    Bad("GET", "/users/{me}/timeline?limit=%EF%BC%91", 400, "invalid_limit"),
    Bad("GET", "/users/{me}/posts?continuation=not-a-token", 400, "invalid_continuation"),
    Bad("GET", "/users/{me}/followers?continuation=", 400, "invalid_continuation"),
    Bad("GET", "/users/{me}/timeline?continuation=x%27%20or%20PartitionKey%20ne%20%27", 400,
        "invalid_continuation"),
    Bad("PATCH", "/users/{me}/posts", 405, "method_not_allowed", auth="none"),
    Bad("GET", "/users/{me}/secrets", 404, "not_found", auth="none"),
]  # fmt: skip


@pytest.fixture
async def victim(client: Client) -> dict[str, str]:
    api = Api(client)
    me, other = unique("victim"), unique("other")
    my_token = await api.register(me)
    other_token = await api.register(other)
    await api.follow(other, other_token, me)
    post = await api.post(me, my_token, "keep me")
    return {"me": me, "other": other, "post": post["post_id"],
            "my_token": my_token, "other_token": other_token}  # fmt: skip


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        return value.format(**names) if "{" in value else value
    if isinstance(value, dict):
        return {key: _fill(item, names) for key, item in value.items()}
    return value


def _auth(kind: str, names: dict[str, str]) -> dict[str, str]:
    me = names["me"]
    tokens = {
        "me": names["my_token"],
        "other": names["other_token"],
        "forged": TokenSigner(b"attacker", token_ttl_s=60).mint_bearer(me),
        "expired": TokenSigner(TEST_SECRET.encode(), token_ttl_s=60).mint_bearer(me, now=0),
    }
    if kind == "none":
        return {}
    if kind == "basic":
        return {"Authorization": f"Basic {names['my_token']}"}
    return bearer(tokens[kind])


async def _snapshot(client: Client, names: dict[str, str]) -> Any:
    """What a hostile request must not change. The victim's home leaves out the victim's
    own post: a worker of the test session (any test in this process may have started it)
    may deliver it between two snapshots."""
    api = Api(client)
    home = await api.timeline_ids(names["me"], names["my_token"])
    return (
        await api.profile(names["me"]),
        [post_id for post_id in home if post_id != names["post"]],
        await (await client.get(f"/users/{names['me']}/posts")).json(),
    )


@pytest.mark.parametrize("bad", CATALOGUE, ids=lambda b: f"{b.method} {b.path} {b.code}"[:80])
async def test_hostile_input_is_rejected_and_changes_nothing(
    client: Client, victim: dict[str, str], bad: Bad
) -> None:
    before = await _snapshot(client, victim)
    headers = _auth(bad.auth, victim) | bad.headers
    if bad.raw is not None:
        response = await client.request(
            bad.method, _fill(bad.path, victim), data=bad.raw, headers=JSON | headers
        )
    elif bad.body is not None:
        response = await client.request(
            bad.method, _fill(bad.path, victim), json=_fill(bad.body, victim), headers=headers
        )
    else:
        response = await client.request(bad.method, _fill(bad.path, victim), headers=headers)
    assert await error_of(response, bad.status) == bad.code
    assert await _snapshot(client, victim) == before


def test_catalogue_is_large() -> None:
    assert len(CATALOGUE) >= 40
