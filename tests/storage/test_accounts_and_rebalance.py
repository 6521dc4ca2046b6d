"""Several storage accounts: placement, flows across accounts, refusal, rebalance, resume.

Every test runs on two or three real Azurite instances of its own.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import (
    api_client,
    eventually,
    make_settings,
    program_env,
    running_worker,
    storage_on,
)
from tests.helpers import Api, bearer
from timeline.config import Settings
from timeline.errors import ConfigurationError
from timeline.storage.accounts import Storage
from timeline.storage.names import TABLES, TIMELINES, USERS
from timeline.storage.placement import Placement, hash64, jump_hash
from timeline.storage.queue import FanoutQueues
from timeline.storage.rebalance import RebalanceError, Rebalancer
from timeline.tools.azurite import Azurite


def _strings(servers: list[Azurite]) -> str:
    return "\n".join(server.connection_string for server in servers)


def _settings(servers: list[Azurite], data_dir: Path, **overrides: Any) -> Settings:
    return make_settings(_strings(servers), data_dir, **overrides)


# -- placement: pure functions ------------------------------------------------------------


def test_the_hashes_are_pinned() -> None:
    """Pinned values: a change of either hash would silently re-home stored partitions."""
    assert [jump_hash(key, 3) for key in (0, 1, 2**63, 2**64 - 1)] == [0, 0, 1, 2]
    assert [jump_hash(key, 10) for key in (0, 1, 2**63, 2**64 - 1)] == [0, 6, 5, 9]
    assert hash64("alice") == 0x4DEAEC0CCE54DA89
    assert [jump_hash(hash64(user), 3) for user in ("alice", "bob", "carol", "dave")] == [
        1,
        1,
        2,
        2,
    ]


def test_placement_is_balanced_and_moves_only_onto_the_new_account() -> None:
    users = [f"user-{n:05d}" for n in range(10_000)]
    two = Placement.initial(("a", "b"), 2)
    three = Placement.initial(("a", "b", "c"), 3)
    per_account = Counter(three.home(hash64(user)) for user in users)
    assert max(per_account.values()) / (len(users) / 3) <= 1.1, per_account
    moved = [user for user in users if two.home(hash64(user)) != three.home(hash64(user))]
    assert all(three.home(hash64(user)) == 2 for user in moved), "moved between old accounts"
    assert 0.28 < len(moved) / len(users) < 0.39, len(moved)


def test_placement_row_round_trips() -> None:
    placement = Placement(7, ("a", "b", "c"), (0, 1), previous=2, moved=frozenset({1, 4095}))
    assert Placement.from_entity(placement.to_entity()) == placement


# -- real storage ----------------------------------------------------------------------------


async def test_posts_follows_and_deletes_cross_accounts(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    """Author and reader on different accounts; every row lands on its partition's home."""
    settings = _settings(three_azurites[:2], tmp_path)
    async with storage_on(three_azurites[:2]) as storage:
        await storage.create_all()
        author, reader = _users_on_different_accounts(storage.placement)
        async with api_client(settings) as client, running_worker(settings):
            api = Api(client)
            author_token, reader_token = await api.register(author), await api.register(reader)
            await api.follow(reader, reader_token, author)
            post = await api.post(author, author_token, "across accounts")

            async def delivered() -> bool:
                return await api.timeline_ids(reader, reader_token) == [post["post_id"]]

            await eventually(delivered, what="the post on the reader's timeline")
            for user in (author, reader):
                home = storage.placement.home(hash64(user))
                profile_and_identity = 2  # ids are lowercase: the identity row shares the partition
                assert await _rows_of(storage, home, USERS, user) == profile_and_identity
                assert await _rows_of(storage, 1 - home, USERS, user) == 0
                assert await _rows_of(storage, 1 - home, TIMELINES, user) == 0
            assert (await api.profile(author))["followers"] == 1
            response = await client.delete(
                f"/users/{author}/posts/{post['post_id']}",
                headers={"Authorization": f"Bearer {author_token}"},
            )
            assert response.status == 204

            async def removed() -> bool:
                return await api.timeline_ids(reader, reader_token) == []

            await eventually(removed, what="the delete on the reader's timeline")
            await api.unfollow(reader, reader_token, author)
            assert (await api.profile(author))["followers"] == 0


def _users_on_different_accounts(placement: Placement) -> tuple[str, str]:
    users = [f"x-{n}" for n in range(100)]
    homes = {placement.home(hash64(user)): user for user in users}
    return homes[0], homes[1]


async def _rows_of(storage: Storage, account: int, table: str, partition_key: str) -> int:
    client = storage.account_table(account, table)
    async with storage.guard():
        return len(
            [
                entity
                async for entity in client.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": partition_key}
                )
            ]
        )


async def test_queue_shards_spread_over_accounts_and_all_are_consumed(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    settings = _settings(three_azurites, tmp_path, queue_shards=4)
    async with storage_on(three_azurites, queue_shards=4) as storage:
        await storage.create_all()
        assert storage.placement.queue_accounts == (0, 1, 2, 0)
        queues = FanoutQueues(storage)
        async with api_client(settings) as client, running_worker(settings):
            api = Api(client)
            authors = [f"s-{n}" for n in range(24)]
            for author in authors:
                await api.post(author, await api.register(author), "hello")
            used = {queues.shard_for_key(author).shard for author in authors}
            assert used == {0, 1, 2, 3}, used

            async def drained() -> bool:
                return await queues.depth() == (0, 0)

            await eventually(drained, what="every shard drained")


async def test_a_worker_consumes_only_the_shards_it_is_given(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    settings = _settings(three_azurites[:1], tmp_path, queue_shards=3, worker_shards="1-2")
    async with storage_on(three_azurites[:1], queue_shards=3) as storage:
        await storage.create_all()
        queues = FanoutQueues(storage)
        malformed = "not a message"  # poisoned at once by whichever worker reads it
        for shard in queues.shards:
            await shard.send_raw(malformed)
        async with running_worker(settings):

            async def others_drained() -> bool:
                depths = [await shard.depth() for shard in queues.shards]
                return depths[1:] == [(0, 1), (0, 1)]

            await eventually(others_drained, what="shards 1 and 2 consumed")
            assert await queues.shards[0].depth() == (1, 0), "shard 0 was consumed"


async def test_a_mismatched_account_list_refuses_to_start(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    first, second, third = three_azurites
    async with storage_on([first, second]) as storage:
        await storage.create_all()
    for wrong in ([second, first], [first], [first, third], [first, second, third, third]):
        with pytest.raises(ConfigurationError):
            async with storage_on(wrong):
                pass
    with pytest.raises(ConfigurationError, match="queue shards"):
        async with storage_on([first, second], queue_shards=5):
            pass
    async with storage_on([first, second, third]) as grown:
        assert len(grown.placement.accounts) == 2, "an added account waits for the rebalance"
    env = program_env(
        storage_connection_strings=_strings([second, first]), data_dir=tmp_path, auth_secret="x"
    )
    for program in (["timeline.tools.cli", "stats"], ["api"], ["fanout_worker"]):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", *program],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode in (1, 2), program
        assert "accounts in the stored order" in done.stderr.splitlines()[-1], program


async def test_rebalance_resumes_after_dying_and_moves_everything(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    """Two accounts of data, a third added; the first rebalance dies at its second fence,
    the second finishes: every row is on its new home, once, and nowhere else."""
    two, three = three_azurites[:2], three_azurites
    settings = _settings(two, tmp_path)
    async with storage_on(two) as storage:
        await storage.create_all()
    users = [f"r-{n}" for n in range(30)]
    async with api_client(settings) as client, running_worker(settings):
        api = Api(client)
        tokens = {user: await api.register(user) for user in users}
        for user in users[1:]:
            await api.follow(user, tokens[user], users[0])
        for user in users[:5]:
            await api.post(user, tokens[user], f"from {user}")

        async def delivered() -> bool:  # every follower has an entry to mark
            for user in users[1:]:
                if not await api.timeline_ids(user, tokens[user]):
                    return False
            return len(await api.timeline_ids(users[-1], tokens[users[-1]])) == 1

        await eventually(delivered, what="fan-out before the rebalance")
        markers = {user: await _mark_newest(client, user, tokens[user]) for user in users[1:]}
    before = await _census(two)

    fences = 0

    async def die_at_second_fence(_seconds: float) -> None:
        nonlocal fences
        fences += 1
        if fences == 2:
            raise RebalanceError("killed")

    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    async with storage_on(three) as storage:
        with pytest.raises(RebalanceError):
            await Rebalancer(storage, margin_s=0, steps=3, sleep=die_at_second_fence).run()
        interrupted = await storage.refresh_placement()
        assert interrupted is not None
        assert not interrupted.settled, "the first run died mid-move"
        report = await Rebalancer(storage, margin_s=0, steps=3, progress=False, sleep=record).run()
        assert waits[0] == 15 + 5, "a resumed rebalance fences first, by the recorded timing"
        await storage.refresh_placement()
        assert storage.placement.settled
        assert len(storage.placement.accounts) == 3
    after = await _census(three)
    assert sorted(row for rows in after.values() for row in rows) == sorted(
        row for rows in before.values() for row in rows
    ), "rows lost or duplicated"
    assert report.partitions > 0
    assert after[2], "nothing moved onto the new account"
    placement = Placement.initial(tuple("abc"), 3)
    for account, rows in after.items():
        assert all(placement.home(hash64(row[1])) == account for row in rows), "a row off home"
    async with api_client(_settings(three, tmp_path)) as client:
        api = Api(client)
        assert len(await api.timeline_ids(users[-1], tokens[users[-1]])) == 1
        assert (await api.profile(users[0]))["followers"] == len(users) - 1
        for user, marker in markers.items():  # read markers move with their partitions
            response = await client.get(f"/users/{user}/markers/home", headers=bearer(tokens[user]))
            assert await response.json() == marker, user
        moved = {**markers[users[-1]], "version": 1}
        response = await client.put(
            f"/users/{users[-1]}/markers/home", json=moved, headers=bearer(tokens[users[-1]])
        )
        assert (await response.json())["version"] == 2, "a version survives the copy's new ETag"


async def _mark_newest(client: TestClient[Any, Any], user: str, token: str) -> dict[str, Any]:
    """Put the user's read marker at its home timeline's newest entry."""
    newest = (await Api(client).timeline(user, token))["newest"]
    body = {"position": newest, "version": 0}
    response = await client.put(f"/users/{user}/markers/home", json=body, headers=bearer(token))
    assert response.status == 200, await response.text()
    marker: dict[str, Any] = await response.json()
    return marker


async def _census(servers: list[Azurite]) -> dict[int, list[tuple[str, str, str]]]:
    """Every (table, partition, row) per account, read straight from each account."""
    census: dict[int, list[tuple[str, str, str]]] = {}
    async with storage_on(servers) as storage:
        for account in range(len(servers)):
            census[account] = []
            for table in TABLES:
                client = storage.account_table(account, table)
                async with storage.guard():
                    census[account] += [
                        (table, entity["PartitionKey"], entity["RowKey"])
                        async for entity in client.list_entities()
                    ]
    return census


def test_worker_shards_parse_ranges_lists_and_one_number() -> None:
    assert Settings(worker_shards="0-3,7").worker_shards == (0, 1, 2, 3, 7)
    assert Settings(worker_shards="3").worker_shards == (3,)
    with pytest.raises(ValueError, match="backwards"):
        Settings(worker_shards="3-1")


async def test_init_with_one_account_under_two_spellings_stores_nothing(
    three_azurites: list[Azurite], tmp_path: Path
) -> None:
    """Refused before a placement naming both spellings is stored: the right list works."""
    first = three_azurites[0].connection_string
    alias = first.replace("127.0.0.1", "localhost")
    with pytest.raises(ConfigurationError, match="twice"):
        async with Storage([first, alias]) as storage:
            await storage.create_all()
    async with Storage(first) as storage:
        await storage.create_all()
        assert len(storage.placement.accounts) == 1
