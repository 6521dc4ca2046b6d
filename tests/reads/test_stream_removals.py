"""Removals on a live stream: a delete and an unfollow's purge arrive as ``delete`` events;
the removal traces that carry them never show in reads and are swept once expired."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from aiohttp import ClientResponse

from tests.conftest import eventually, unique
from tests.helpers import put_copies, trace_keys
from tests.reads.conftest import Live, merged_author
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, TIMELINES
from timeline.tables import traces
from timeline.tables.counters import count_of
from timeline.tables.repositories import Repositories
from timeline.tables.traces import sweep_traces, trace_key


async def _next_events(response: ClientResponse, count: int) -> list[tuple[str, Any]]:
    """The next ``count`` events as (event, data), ignoring comments."""
    events: list[tuple[str, Any]] = []
    fields: dict[str, str] = {}
    async with asyncio.timeout(60):
        while len(events) < count:
            line = (await response.content.readline()).decode().rstrip("\n")
            if line == "" and "data" in fields:
                events.append((fields["event"], orjson.loads(fields["data"])))
                fields = {}
            elif line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return events


async def test_a_delete_and_an_unfollow_purge_arrive_as_delete_events(live: Live) -> None:
    reader, friend, other = [await live.user(p) for p in ("reader", "friend", "other")]
    for subject in (friend, other):
        await live.api.follow(reader, live.tokens[reader], subject)
    stream = await live.stream(reader)
    assert stream.status == 200
    doomed, purged = await live.post(friend, "doomed"), await live.post(other, "purged")
    posts = await _next_events(stream, 2)
    assert sorted(data["post_id"] for _, data in posts) == sorted([doomed, purged])

    deleted = await live.client.delete(
        f"/users/{friend}/posts/{doomed}",
        headers={"Authorization": f"Bearer {live.tokens[friend]}"},
    )
    assert deleted.status == 204
    assert await _next_events(stream, 1) == [("delete", {"post_id": doomed})]

    await live.api.unfollow(reader, live.tokens[reader], other)
    assert await _next_events(stream, 1) == [("delete", {"post_id": purged})]
    stream.close()


async def test_a_merged_authors_delete_arrives_as_a_delete_event(live: Live) -> None:
    reader = await live.user("reader")
    large = await merged_author(live)
    await live.api.follow(reader, live.tokens[reader], large)
    stream = await live.stream(reader)
    made = await live.post(large, "merged")
    assert await _next_events(stream, 1) == [("post", (await _post_json(live, reader, made)))]
    deleted = await live.client.delete(
        f"/users/{large}/posts/{made}", headers={"Authorization": f"Bearer {live.tokens[large]}"}
    )
    assert deleted.status == 204
    events = await _next_events(stream, 1)  # the copy in the author's own timeline goes too
    assert events == [("delete", {"post_id": made})]
    stream.close()


async def _post_json(live: Live, reader: str, post_id: str) -> dict[str, Any]:
    page = await live.page(reader)
    return next(item for item in page["items"] if item["post_id"] == post_id)


async def test_traces_are_never_in_pages_trims_or_counts(
    storage: Storage, repos: Repositories
) -> None:
    owner = unique("reader")
    posts = [Post(new_post_id(now_ticks() + i), "friend", str(i)) for i in range(6)]
    await put_copies(storage, owner, posts)
    rows = [
        (post.row_key, await repos.timelines.etag_of(owner, post.row_key)) for post in posts[:3]
    ]
    assert await repos.timelines.remove_unchanged(owner, [(k, t) for k, t in rows if t]) == 3
    assert sorted(await trace_keys(storage, TIMELINES, owner)) == sorted(
        trace_key(post.row_key) for post in posts[:3]
    )
    page = await repos.timelines.page(owner, 100, None)
    assert [post.post_id for post in page.items] == [post.post_id for post in posts[3:][::-1]]
    assert await repos.timelines.trim(owner, 3) == 0  # three entries, however many traces

    author = unique("author")
    made = [
        await repos.posts.add(Post(new_post_id(now_ticks() + i), author, "x")) for i in range(2)
    ]
    assert await repos.posts.delete(author, made[0].post_id)
    assert await trace_keys(storage, POSTS, author) == [trace_key(made[0].row_key)]
    assert await count_of(storage, POSTS, author) == 1
    assert [post.post_id for post in (await repos.posts.page(author, 10, None)).items] == [
        made[1].post_id
    ]


async def test_traces_expire_swept_by_the_trim_and_the_next_delete(
    storage: Storage, repos: Repositories, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, author = unique("reader"), unique("author")
    posts = [Post(new_post_id(now_ticks() + i), "friend", str(i)) for i in range(3)]
    await put_copies(storage, owner, posts)
    etag = await repos.timelines.etag_of(owner, posts[0].row_key)
    assert etag is not None
    await repos.timelines.remove_unchanged(owner, [(posts[0].row_key, etag)])
    made = [
        await repos.posts.add(Post(new_post_id(now_ticks() + i), author, "x")) for i in range(2)
    ]
    await repos.posts.delete(author, made[0].post_id)

    # young traces stay: a stream that looks back may still need them
    assert await sweep_traces(storage, TIMELINES, owner) == 0
    await repos.timelines.trim(owner, 10)
    assert len(await trace_keys(storage, TIMELINES, owner)) == 1
    later = datetime.now(UTC) + timedelta(seconds=traces.TRACE_LIFETIME_S + 5)
    assert await sweep_traces(storage, TIMELINES, owner, now=later) == 1
    assert await trace_keys(storage, TIMELINES, owner) == []

    # the trim sweeps a timeline's expired traces; the next delete an author's
    await repos.timelines.remove_unchanged(
        owner, [(posts[1].row_key, str(await repos.timelines.etag_of(owner, posts[1].row_key)))]
    )
    monkeypatch.setattr(traces, "TRACE_LIFETIME_S", -5.0)  # every trace is expired
    await repos.timelines.trim(owner, 10)
    assert await trace_keys(storage, TIMELINES, owner) == []
    assert await repos.posts.delete(author, made[1].post_id)
    assert await trace_keys(storage, POSTS, author) == []


async def test_unfollowing_a_merged_author_streams_its_posts_removal(live: Live) -> None:
    """The merged author's posts come from its own partition, so no purge traces them: the
    merge row's removal (or a follow check) makes the stream send their deletes."""
    reader = await live.user("reader")
    large = await merged_author(live)
    await live.api.follow(reader, live.tokens[reader], large)

    async def merging() -> bool:
        return large in await live.repos.audience.merged_authors(reader)

    await eventually(merging, timeout_s=60, what="the merge row")
    stream = await live.stream(reader)
    made = await live.post(large, "merged")
    assert (await _next_events(stream, 1))[0][1]["post_id"] == made
    await live.api.unfollow(reader, live.tokens[reader], large)
    events = await asyncio.wait_for(_next_events(stream, 1), 30)
    assert events == [("delete", {"post_id": made})]
    stream.close()
