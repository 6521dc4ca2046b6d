"""Hot subjects: one user followed and unfollowed by many clients at once is never refused,
and every counter stays exact (counters sharded over several rows, summed on read)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import TEST_SECRET, api_client, make_settings, unique
from tests.helpers import Api, bearer
from timeline.metrics import COUNTER_CONFLICTS
from timeline.model.entities import Post
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING
from timeline.tables import counters
from timeline.tables.counters import count_of
from timeline.tables.repositories import Repositories
from timeline.tools.azurite import Azurite

Client = TestClient[Any, Any]
CLIENTS = 64
FOLLOWS = [pytest.param(1500, marks=pytest.mark.long), 200]
"""Followers in a storm: ``make test-long`` takes the size the bench's follow storm has."""


@contextlib.asynccontextmanager
async def hot_stack(azurite: Azurite, tmp_path: Path) -> AsyncIterator[tuple[Client, Storage]]:
    """The app on an Azurite of the test's own (3,000 queued messages stay out of the others'
    queue), with tables and queues created."""
    settings = make_settings(azurite.connection_string, tmp_path)
    async with Storage(settings.connection_string(), settings.storage_options()) as storage:
        await storage.create_all()
        async with api_client(settings) as client:
            yield client, storage


async def storm(client: Client, method: str, star: str, followers: list[str]) -> list[int]:
    """``CLIENTS`` clients sending one request per follower; every answer's status."""
    signer = TokenSigner(TEST_SECRET.encode(), token_ttl_s=3600)
    pending = iter(followers)
    statuses: list[int] = []

    async def one_client() -> None:
        for follower in pending:  # a shared iterator: each follower is taken by one client
            headers = bearer(signer.mint_bearer(follower))
            url = f"/users/{follower}/following/{star}"
            async with client.request(method, url, headers=headers) as response:
                statuses.append(response.status)

    await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return statuses


@pytest.mark.parametrize("follows", FOLLOWS)
async def test_follow_and_unfollow_storm_on_one_user(
    private_azurite: Azurite, tmp_path: Path, follows: int
) -> None:
    async with hot_stack(private_azurite, tmp_path) as (client, storage):
        api, star = Api(client), unique("star")
        await api.register(star)
        followers = [f"fan-{i:05d}" for i in range(follows)]
        statuses = await storm(client, "PUT", star, followers)
        assert sorted(set(statuses)) == [204], {s: statuses.count(s) for s in set(statuses)}
        assert (await api.profile(star))["followers"] == follows
        assert await count_of(storage, SUBJECT_FOLLOWING, followers[0]) == 1
        unfollowed = followers[: follows // 2]
        statuses = await storm(client, "DELETE", star, unfollowed)
        assert sorted(set(statuses)) == [204], {s: statuses.count(s) for s in set(statuses)}
        assert (await api.profile(star))["followers"] == follows - len(unfollowed)
        assert await count_of(storage, SUBJECT_FOLLOWING, followers[0]) == 0
        assert await count_of(storage, SUBJECT_FOLLOWING, followers[-1]) == 1


async def test_repeated_follows_count_once(private_azurite: Azurite, tmp_path: Path) -> None:
    """Retried requests (the same follow sent by several clients at once) count once."""
    async with hot_stack(private_azurite, tmp_path) as (client, _):
        api, star = Api(client), unique("star")
        await api.register(star)
        followers = [f"fan-{i:03d}" for i in range(100)]
        statuses = await storm(client, "PUT", star, followers * 4)
        assert set(statuses) == {204}
        assert (await api.profile(star))["followers"] == len(followers)
        statuses = await storm(client, "DELETE", star, followers * 4)
        assert set(statuses) == {204}
        assert (await api.profile(star))["followers"] == 0


async def test_counter_rows_stay_out_of_listings(repos: Repositories, storage: Storage) -> None:
    """Counter rows sort after every user id and post key: no listing shows them."""
    star, now = unique("star"), datetime.now(UTC)
    fans = [f"fan-{i:02d}" for i in range(20)]
    await asyncio.gather(*(repos.follows.add(fan, star, now) for fan in fans))
    await asyncio.gather(*(repos.follows.sync_index(fan, star) for fan in fans))
    posts = [Post(new_post_id(now_ticks() + i), star, "x") for i in range(20)]
    await asyncio.gather(*(repos.posts.add(post) for post in posts))
    followers = await repos.follows.followers_page(star, 250, None)
    assert [edge.user_id for edge in followers.items] == fans
    assert (await repos.follows.follower_ids_page(star, 250, None)).items == fans
    listed = (await repos.posts.page(star, 250, None)).items
    assert {post.post_id for post in listed} == {post.post_id for post in posts}
    following = await repos.follows.following_page(fans[0], 250, None)
    assert [edge.user_id for edge in following.items] == [star]
    assert await count_of(storage, POSTS, star) == 20


async def test_changes_in_one_process_never_conflict(repos: Repositories, storage: Storage) -> None:
    """64 changes of one partition at once from one process each hold a shard of their own
    (or wait for one): no write is thrown away on a shard's ETag."""
    star, now = unique("star"), datetime.now(UTC)
    before = COUNTER_CONFLICTS._value.get()
    await asyncio.gather(*(repos.follows.add(f"fan-{i:02d}", star, now) for i in range(CLIENTS)))
    assert COUNTER_CONFLICTS._value.get() == before
    assert await count_of(storage, SUBJECT_FOLLOWERS, star) == CLIENTS


async def test_shard_changed_by_another_process_is_retried(
    repos: Repositories, storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process rewrites the shard between our read and our write, three times: the
    change is retried on other shards and counted once."""
    star, now = unique("star"), datetime.now(UTC)
    read_shard = counters._shard_operation
    raced: list[str] = []

    async def racing(*args: Any) -> Any:
        operation = await read_shard(*args)
        if len(raced) < 3:
            row = {**operation[1], "n": operation[1]["n"] - args[-1]}  # value unchanged
            await storage.table(SUBJECT_FOLLOWERS, star).upsert_entity(row)
            raced.append(row["RowKey"])
        return operation

    monkeypatch.setattr(counters, "_shard_operation", racing)
    before = COUNTER_CONFLICTS._value.get()
    assert await repos.follows.add("fan", star, now)
    assert COUNTER_CONFLICTS._value.get() == before + 3
    assert all(a != b for a, b in itertools.pairwise(raced)), raced  # elsewhere
    assert await count_of(storage, SUBJECT_FOLLOWERS, star) == 1
