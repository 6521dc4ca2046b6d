"""Newer-than reads (``since``, ``newest``) and the live stream of a home timeline, on plain
and merged (hybrid) timelines, against a real worker and Azurite."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import ClientResponse

from tests.conftest import (
    TEST_SECRET,
    api_client,
    eventually,
    make_settings,
    program_env,
    unique,
)
from tests.helpers import Api, bearer, error_of, put_copies
from tests.reads.conftest import Live, merged_author
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.tools.azurite import Azurite, free_ports


async def test_since_returns_only_newer_posts_paged_down_to_it(live: Live) -> None:
    reader, friend = await live.user("reader"), await live.user("friend")
    large = await merged_author(live)
    for subject in (friend, large):
        await live.api.follow(reader, live.tokens[reader], subject)
    older = [await live.post(author) for author in (friend, large, reader)]
    await live.shows(reader, older[::-1])
    first = await live.page(reader)
    assert first["newest"] is not None
    newer = [await live.post(author) for author in (large, friend, reader, large, friend)]
    await live.shows(reader, newer[::-1])

    for limit in (1, 2, 3, 250):
        pages = await live.newer(reader, first["newest"], limit)
        assert [post for page in pages for post in page] == newer[::-1], f"limit {limit}"
        assert all(1 <= len(page) <= limit for page in pages[:-1]), f"limit {limit}"

    latest = await live.page(reader, since=first["newest"])
    assert (await live.page(reader, since=latest["newest"])) == {
        "items": [],
        "continuation": None,
        "newest": None,
    }


async def test_since_on_a_users_posts(live: Live) -> None:
    author = await live.user("author")
    older = [await live.post(author) for _ in range(2)]
    response = await live.client.get(f"/users/{author}/posts")
    first = await response.json()
    assert first["newest"] is not None
    assert [item["post_id"] for item in first["items"]] == older[::-1]
    newer = [await live.post(author) for _ in range(3)]
    seen: list[str] = []
    params = {"since": first["newest"], "limit": "2"}
    while True:
        response = await live.client.get(f"/users/{author}/posts", params=params)
        assert response.status == 200, await response.text()
        page = await response.json()
        seen += [item["post_id"] for item in page["items"]]
        if page["continuation"] is None:
            break
        params = {"since": first["newest"], "limit": "2", "continuation": page["continuation"]}
    assert seen == newer[::-1]


async def test_bad_positions_are_clear_400s(live: Live) -> None:
    reader, other = await live.user("reader"), await live.user("other")
    await live.shows(reader, [await live.post(reader)])
    await live.post(other)
    mine = (await live.page(reader))["newest"]
    posts = await (await live.client.get(f"/users/{other}/posts")).json()
    token = live.tokens[reader]
    url = f"/users/{reader}/timeline"
    for since in ("", "garbage", "a.b", posts["newest"], mine[:-2] + "AA", "é" * 10):
        response = await live.client.get(url, params={"since": since}, headers=bearer(token))
        assert await error_of(response, 400) == "invalid_since", since
    await live.shows(reader, [await live.post(reader) for _ in range(2)][::-1])
    page = await live.page(reader, since=mine, limit=1)
    moved = (await live.page(reader))["newest"]
    response = await live.client.get(
        url,
        params={"since": moved, "continuation": page["continuation"]},
        headers=bearer(token),
    )
    assert await error_of(response, 400) == "invalid_since"


async def _events(response: ClientResponse, count: int) -> list[dict[str, Any]]:
    """The next ``count`` events of an SSE response: id, event and the parsed data."""
    events: list[dict[str, Any]] = []
    fields: dict[str, str] = {}
    async with asyncio.timeout(30):
        while len(events) < count:
            line = (await response.content.readline()).decode().rstrip("\n")
            if line == "" and "data" in fields:
                events.append(fields | {"data": orjson.loads(fields["data"])})
                fields = {}
            elif line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return events


async def test_stream_sends_posts_as_they_land_and_resumes_from_last_event_id(
    live: Live,
) -> None:
    reader, friend = await live.user("reader"), await live.user("friend")
    large = await merged_author(live)
    for subject in (friend, large):
        await live.api.follow(reader, live.tokens[reader], subject)
    before = await live.post(friend)
    await live.shows(reader, [before])

    stream = await live.stream(reader)
    assert stream.status == 200
    assert stream.headers["Content-Type"] == "text/event-stream"
    sent = [await live.post(friend, "one"), await live.post(large, "two")]
    events = await _events(stream, 2)
    # the merged author's post shows at once, the friend's once fanned out: either order
    assert sorted(event["data"]["post_id"] for event in events) == sent
    assert {event["event"] for event in events} == {"post"}
    assert {event["data"]["text"] for event in events} == {"one", "two"}
    stream.close()
    last = max(events, key=lambda event: event["data"]["post_id"])["id"]

    # the ids are positions: 'since' takes them, and a reconnect resumes after the last
    missed = [await live.post(large, "three"), await live.post(friend, "four")]
    await live.shows(reader, missed[::-1])
    newer = await live.page(reader, since=last)
    assert [item["post_id"] for item in newer["items"]] == missed[::-1]
    resumed = await live.stream(reader, **{"Last-Event-ID": last})
    replay = await _events(resumed, 5)
    # the look-back window is sent again, so the client dedupes; nothing is missed
    assert [event["data"]["post_id"] for event in replay] == [before, *sent, *missed]
    resumed.close()


async def test_an_entry_that_lands_late_is_still_streamed(live: Live) -> None:
    """A post made before the newest entry sent, landing after it (fan-out lag)."""
    reader = await live.user("reader")
    stream = await live.stream(reader)
    late_id = new_post_id(now_ticks())
    first = await live.post(reader, "first")
    assert [e["data"]["post_id"] for e in await _events(stream, 1)] == [first]
    late = Post(post_id=late_id, author=reader, text="late")
    await put_copies(live.storage, reader, [late])
    assert [e["data"]["post_id"] for e in await _events(stream, 1)] == [late_id]
    stream.close()


async def test_stream_checks_its_caller_and_bounds_streams(live: Live) -> None:
    reader, other = await live.user("reader"), await live.user("other")
    url = f"/users/{reader}/timeline/stream"
    assert await error_of(await live.client.get(url), 401) == "missing_token"
    forbidden = await live.client.get(url, headers=bearer(live.tokens[other]))
    assert await error_of(forbidden, 403) == "forbidden"
    bad = await live.stream(reader, **{"Last-Event-ID": "nonsense"})
    assert await error_of(bad, 400) == "invalid_last_event_id"

    bad_since = await live.client.get(
        url, params={"since": "nonsense"}, headers=bearer(live.tokens[reader])
    )
    assert await error_of(bad_since, 400) == "invalid_since"

    streams = [await live.stream(reader), await live.stream(reader)]
    assert [stream.status for stream in streams] == [200, 200]
    mine = await live.stream(reader)  # one user cannot take every slot
    assert await error_of(mine, 429) == "too_many_streams"
    streams.append(await live.stream(other))
    assert streams[-1].status == 200
    refused = await live.stream(other)
    assert await error_of(refused, 503) == "overloaded"
    assert refused.headers["Retry-After"] == "5"

    heartbeat = await asyncio.wait_for(_comment(streams[0]), 10)
    assert heartbeat == ": heartbeat"
    streams[0].close()

    async def freed() -> bool:
        response = await live.stream(reader)
        response.close()
        return response.status == 200

    await eventually(freed, what="a closed stream to free its slot")
    for stream in streams[1:]:
        stream.close()


async def test_a_stream_ends_when_its_token_expires(live: Live) -> None:
    reader = await live.user("reader")
    signer = TokenSigner(TEST_SECRET.encode(), token_ttl_s=60)
    token = signer.mint_bearer(reader, now=time.time() - 58)  # 2 s left
    stream = await live.client.get(f"/users/{reader}/timeline/stream", headers=bearer(token))
    assert stream.status == 200
    rest = await asyncio.wait_for(stream.content.read(), 15)  # the server ends it
    assert rest.startswith(b"retry: 2000\n\n")
    again = await live.client.get(f"/users/{reader}/timeline/stream", headers=bearer(token))
    assert await error_of(again, 401) == "expired_token"


async def test_a_stream_resumed_from_long_ago_sends_at_most_a_capped_timeline(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    """However old the position, one poll reads and sends at most the cap (once,
    a resumed stream read the whole history of every merged author)."""
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        max_timeline_items=3,
        stream_poll_s=0.1,
        stream_heartbeat_s=1,
    )
    async with Storage(settings.connection_string()) as storage:
        await storage.create_all()
        async with api_client(settings) as client:
            api, reader = Api(client), unique("reader")
            token = await api.register(reader)
            old = Post(post_id=new_post_id(now_ticks()), author=reader, text="old")
            await put_copies(storage, reader, [old])
            position = (await api.timeline(reader, token))["newest"]
            newer = [Post(new_post_id(now_ticks() + i), reader, f"{i}") for i in range(10)]
            await put_copies(storage, reader, newer)
            stream = await client.get(
                f"/users/{reader}/timeline/stream",
                headers=bearer(token) | {"Last-Event-ID": position},
            )
            events = await _events(stream, 3)
            assert [event["data"]["text"] for event in events] == ["7", "8", "9"]
            assert await asyncio.wait_for(_comment(stream), 10) == ": heartbeat"
            stream.close()


async def _comment(response: ClientResponse) -> str:
    while True:
        line = (await response.content.readline()).decode().rstrip("\n")
        if line.startswith(":"):
            return line


async def test_a_stopping_api_ends_its_streams(azurite: Azurite, tmp_path: Path) -> None:
    """SIGTERM ends open streams at once; aiohttp would otherwise wait for them a minute."""
    (port,) = free_ports(1)
    env = program_env(
        storage_connection_string=azurite.connection_string,
        data_dir=tmp_path,
        auth_secret=TEST_SECRET,
        port=port,
        registrations_per_minute=0,
    )
    command = (sys.executable, "-m")
    init = await asyncio.create_subprocess_exec(*command, "timeline.tools.cli", "init", env=env)
    assert await init.wait() == 0
    api = await asyncio.create_subprocess_exec(*command, "api", env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(base) as session:

            async def ready() -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get("/readyz") as response:
                        return response.status == 200
                return False

            await eventually(ready, what="the API to answer")
            reader = unique("reader")
            token = await Api(session).register(reader)
            stream = await session.get(f"/users/{reader}/timeline/stream", headers=bearer(token))
            assert stream.status == 200
            api.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(api.wait(), 15) == 0
            assert await asyncio.wait_for(stream.content.read(), 5) == b"retry: 2000\n\n"
    finally:
        if api.returncode is None:
            api.kill()
            await api.wait()
