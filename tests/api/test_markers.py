"""Read markers (``GET/PUT /users/{id}/markers/home``) against the app on a real Azurite: the
contract, bad input, only the owner, a retried write, and two devices racing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from api import schemas
from fanout_worker.worker import Worker
from tests.conftest import TEST_SECRET, eventually, unique
from tests.helpers import Api, bearer, body_of, error_of
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.model.tokens import TokenSigner

Client = TestClient[Any, Any]
SIGNER = TokenSigner(TEST_SECRET.encode(), token_ttl_s=60)


def position(owner: str, scope: str | None = None) -> str:
    """A home timeline position of ``owner`` as a page's ``newest`` carries one."""
    row_key = post_row_key(new_post_id(now_ticks()))
    return SIGNER.encode_position(scope or f"timeline:{owner}", row_key)


def path(user: str) -> str:
    return f"/users/{user}/markers/home"


async def put(client: Client, user: str, token: str, body: Any) -> Any:
    return await client.put(path(user), json=body, headers=bearer(token))


async def marker(client: Client, user: str, token: str) -> dict[str, Any]:
    response = await client.get(path(user), headers=bearer(token))
    assert response.status == 200, await response.text()
    data: dict[str, Any] = await body_of(response, schemas.Marker)
    return data


async def moved(client: Client, user: str, token: str, at: str, version: int) -> dict[str, Any]:
    response = await put(client, user, token, {"position": at, "version": version})
    assert response.status == 200, await response.text()
    data: dict[str, Any] = await body_of(response, schemas.Marker)
    return data


async def test_no_marker_reads_as_null_at_version_0(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user)
    assert await marker(client, user, token) == {"position": None, "version": 0}


async def test_a_pages_newest_round_trips(api: Api, client: Client, worker: Worker) -> None:
    user = unique()
    token = await api.register(user)
    await api.post(user, token, "first")

    async def arrived() -> bool:
        return bool((await api.timeline(user, token))["items"])

    await eventually(arrived, what="the post on its author's home timeline")
    newest = (await api.timeline(user, token))["newest"]
    assert await moved(client, user, token, newest, 0) == {"position": newest, "version": 1}
    assert await marker(client, user, token) == {"position": newest, "version": 1}
    assert (await api.timeline(user, token, since=newest))["items"] == []
    later = position(user)
    assert await moved(client, user, token, later, 1) == {"position": later, "version": 2}
    assert await marker(client, user, token) == {"position": later, "version": 2}
    items = (await api.timeline(user, token))["items"]
    assert [item["text"] for item in items] == ["first"]  # the marker row is not an entry


async def test_a_stale_version_is_409(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user)
    first, second = position(user), position(user)
    await moved(client, user, token, first, 0)
    for version in (0, 2, 7):
        response = await put(client, user, token, {"position": second, "version": version})
        assert await error_of(response, 409) == "stale_marker"
    assert await marker(client, user, token) == {"position": first, "version": 1}


async def test_a_retried_write_answers_as_the_first_did(api: Api, client: Client) -> None:
    """A PUT whose answer was lost, sent again: the same answer, not a 409; once another
    write has moved the marker on, the old retry is stale."""
    user = unique()
    token = await api.register(user)
    first, second, third = position(user), position(user), position(user)
    for _ in range(2):
        assert await moved(client, user, token, first, 0) == {"position": first, "version": 1}
    for _ in range(2):
        assert await moved(client, user, token, second, 1) == {"position": second, "version": 2}
    await moved(client, user, token, third, 2)
    response = await put(client, user, token, {"position": second, "version": 1})
    assert await error_of(response, 409) == "stale_marker"
    assert await marker(client, user, token) == {"position": third, "version": 3}


RACE_ROUNDS = 6


async def test_two_devices_racing_one_wins(api: Api, client: Client) -> None:
    """Two writes from the same version, sent together: exactly one 200, one 409, and the
    stored marker is the winner's, from the first write (insert) and from later ones."""
    user = unique()
    token = await api.register(user)
    for version in range(RACE_ROUNDS):
        mine, theirs = position(user), position(user)
        responses = await asyncio.gather(
            put(client, user, token, {"position": mine, "version": version}),
            put(client, user, token, {"position": theirs, "version": version}),
        )
        statuses = sorted(response.status for response in responses)
        assert statuses == [200, 409], statuses
        winner = next(r for r in responses if r.status == 200)
        loser = next(r for r in responses if r.status == 409)
        assert await error_of(loser, 409) == "stale_marker"
        won = await body_of(winner, schemas.Marker)
        assert won["version"] == version + 1
        assert await marker(client, user, token) == won


async def test_only_the_owner_reads_or_writes(api: Api, client: Client) -> None:
    owner, other = unique(), unique()
    token, other_token = await api.register(owner), await api.register(other)
    at = position(owner)
    await moved(client, owner, token, at, 0)
    assert await error_of(await client.get(path(owner)), 401) == "missing_token"
    response = await client.get(path(owner), headers=bearer(other_token))
    assert await error_of(response, 403) == "forbidden"
    response = await put(client, owner, other_token, {"position": at, "version": 1})
    assert await error_of(response, 403) == "forbidden"
    response = await client.put(path(owner), json={"position": at, "version": 1})
    assert await error_of(response, 401) == "missing_token"
    assert await marker(client, owner, token) == {"position": at, "version": 1}


BAD_BODIES: list[tuple[Any, str]] = [
    ({}, "invalid_body"),
    ({"version": 0}, "invalid_body"),
    ({"position": "{position}"}, "invalid_body"),
    ({"position": None, "version": 0}, "invalid_body"),
    ({"position": 5, "version": 0}, "invalid_body"),
    ({"position": "{position}", "version": "0"}, "invalid_body"),
    ({"position": "{position}", "version": True}, "invalid_body"),
    ({"position": "{position}", "version": None}, "invalid_body"),
    ({"position": "{position}", "version": 1.5}, "invalid_body"),
    ({"position": "{position}", "version": -1}, "invalid_body"),
    ({"position": "{position}", "version": 2**53}, "invalid_body"),
    ({"position": "{position}", "version": 10**30}, "invalid_body"),
    ({"position": "{position}", "version": 0, "extra": 1}, "invalid_body"),
    ({"position": "", "version": 0}, "invalid_position"),
    ({"position": "x" * 5000, "version": 0}, "invalid_position"),
    ({"position": "💥" * 1000, "version": 0}, "invalid_position"),
    ({"position": "a.b", "version": 0}, "invalid_position"),
    ({"position": "{other}", "version": 0}, "invalid_position"),
    ({"position": "{posts}", "version": 0}, "invalid_position"),
    ({"position": "{tampered}", "version": 0}, "invalid_position"),
    ([], "invalid_body"),
    ("position", "invalid_body"),
]


@pytest.mark.parametrize(("body", "code"), BAD_BODIES)
async def test_bad_bodies_are_400s(api: Api, client: Client, body: Any, code: str) -> None:
    user = unique()
    token = await api.register(user)
    good = position(user)
    payload, signature = good.split(".")
    forms = {
        "{position}": good,
        "{other}": position(unique()),
        "{posts}": position(user, f"posts:{user}"),
        "{tampered}": f"{payload}.{signature[::-1]}",
    }
    if isinstance(body, dict):
        body = {k: forms.get(v, v) if isinstance(v, str) else v for k, v in body.items()}
    response = await put(client, user, token, body)
    assert await error_of(response, 400) == code
    assert await marker(client, user, token) == {"position": None, "version": 0}


async def test_bodies_that_are_not_json_objects(api: Api, client: Client) -> None:
    user = unique()
    token = await api.register(user)
    headers = {**bearer(token), "Content-Type": "application/json"}
    for raw, code in ((b"{", "invalid_json"), (b'{"position": "\xff"}', "invalid_json")):
        response = await client.put(path(user), data=raw, headers=headers)
        assert await error_of(response, 400) == code
    response = await client.put(path(user), data=b"{}", headers=bearer(token))
    assert await error_of(response, 415) == "unsupported_media_type"
    response = await put(client, user, token, {"position": "x" * 100_000, "version": 0})
    assert await error_of(response, 413) == "body_too_large"
    assert await marker(client, user, token) == {"position": None, "version": 0}
