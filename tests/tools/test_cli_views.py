"""``timeline stats`` and ``timeline poison`` as an operator runs them: subprocesses against
a storage of the test's own."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from tests.conftest import api_client, make_settings, program_env
from tests.helpers import Api, bearer, visible_work
from timeline.model.entities import PROFILE_ROW_KEY
from timeline.model.keys import new_post_id, now_ticks, post_row_key
from timeline.storage.accounts import Storage
from timeline.storage.names import POSTS, TIMELINES, USERS
from timeline.storage.queue import FanoutQueue
from timeline.tables.activity import STAMP_ROW
from timeline.tables.counters import shard_key
from timeline.tables.credentials import IDENTITY_ROW_KEY
from timeline.tools.azurite import Azurite
from timeline.tools.views import POISON_HEADER


def cli(server: Azurite, *args: str) -> subprocess.CompletedProcess[str]:
    env = program_env(storage_connection_string=server.connection_string)
    return subprocess.run(  # noqa: S603 - this interpreter, a fixed module
        [sys.executable, "-m", "timeline.tools.cli", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def run_cli(server: Azurite, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, server, *args)


async def poison(shard: FanoutQueue, content: str, reason: str) -> None:
    """Park one message the way the worker does: sent, leased, then poisoned."""
    lane = shard.lanes[0]
    await lane.send_raw(content)
    [message] = await lane.receive(1, 30)
    await lane.poison(message, reason)


def listed(stdout: str) -> list[list[str]]:
    lines = stdout.splitlines()
    assert lines[0] == POISON_HEADER
    return [line.split("\t") for line in lines[1:]]


async def test_poison_list_says_when_there_are_none(own: Storage, private_azurite: Azurite) -> None:
    done = await run_cli(private_azurite, "poison", "list")
    assert (done.returncode, done.stdout) == (0, "no poison messages\n"), done.stderr


async def test_poison_list_prints_a_header_and_one_line_per_message(
    own: Storage, private_azurite: Azurite
) -> None:
    shard = FanoutQueue(own)
    await poison(shard, '{"not": "a message"}\nsecond line', "malformed: line one\n\tline two")
    await poison(shard, "x" * 500, "failed: " + "y" * 500)
    done = await run_cli(private_azurite, "poison", "list")
    rows = listed(done.stdout)
    assert len(rows) == 2, done.stdout
    assert all(len(row) == 5 for row in rows), done.stdout
    assert rows[0][3] == "malformed: line one line two"
    assert rows[0][4] == '{"not": "a message"} second line'
    assert len(rows[1][3]) == 120
    assert rows[1][3].endswith("...")
    assert rows[0][2] == rows[1][2] == "1"  # dequeue count when parked


async def test_poison_drop_and_requeue_one_message_by_id(
    own: Storage, private_azurite: Azurite
) -> None:
    shard = FanoutQueue(own)
    for index in range(3):
        await poison(shard, f"message {index}", f"malformed: {index}")
    ids = [row[0] for row in listed((await run_cli(private_azurite, "poison", "list")).stdout)]

    dropped = await run_cli(private_azurite, "poison", "drop", ids[1])
    assert dropped.returncode == 0, dropped.stderr
    assert f"dropped poison message {ids[1]} (malformed: 1)" in dropped.stdout
    rows = listed((await run_cli(private_azurite, "poison", "list")).stdout)
    assert sorted(row[0] for row in rows) == sorted([ids[0], ids[2]])  # the others visible

    again = await run_cli(private_azurite, "poison", "drop", ids[1])
    assert again.returncode == 2
    assert f"no poison message has id {ids[1]!r}" in again.stderr
    assert "Traceback" not in again.stderr

    requeued = await run_cli(private_azurite, "poison", "requeue", ids[2])
    assert requeued.returncode == 0, requeued.stderr
    assert [m.content for m in await visible_work(shard)] == ["message 2"]
    twice = await run_cli(private_azurite, "poison", "requeue", ids[2])
    assert twice.returncode == 2
    assert "no poison message has id" in twice.stderr
    assert [m.content for m in await visible_work(shard)] == ["message 2"]  # sent once
    rows = listed((await run_cli(private_azurite, "poison", "list")).stdout)
    assert [row[0] for row in rows] == [ids[0]]


async def test_stats_separates_people_from_internal_rows_and_ready_from_delayed_work(
    own: Storage, private_azurite: Azurite
) -> None:
    post_id = new_post_id(now_ticks())
    rows = {
        USERS: [PROFILE_ROW_KEY, IDENTITY_ROW_KEY],
        POSTS: [post_row_key(post_id), shard_key(0)],
        TIMELINES: [post_row_key(post_id), STAMP_ROW],
    }
    for table, keys in rows.items():
        for key in keys:
            entity = {"PartitionKey": "alice", "RowKey": key, "author": "alice", "text": "hi"}
            await own.account_table(0, table).upsert_entity(entity)
    lane = FanoutQueue(own).lanes[0]
    await lane.send_raw("now")
    await lane.send_raw("a second pass", visible_in_s=300)

    done = await run_cli(private_azurite, "stats")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "table users: 1 users, 1 internal row(s) (2 rows by account)" in lines
    assert "table posts: 1 posts, 1 internal row(s) (2 rows by account)" in lines
    assert "table timelines: 1 timeline entries, 1 internal row(s) (2 rows by account)" in lines
    assert "table expiries: 0 internal row(s) (0 rows by account)" in lines
    assert "queue fanout-0 (account 0): 2 message(s): 1 ready now, 1 delayed or leased" in lines, (
        done.stdout
    )
    assert "queue fanout-0-poison (account 0): 0" in lines
    assert any("'delayed or leased' is second passes" in line for line in lines)


async def test_stats_counts_live_follows_in_both_follow_tables(
    own: Storage, private_azurite: Azurite, tmp_path: Path
) -> None:
    async with api_client(make_settings(private_azurite.connection_string, tmp_path)) as client:
        api = Api(client)
        tokens = {user: await api.register(user) for user in ("alice", "bob", "carol", "dave")}
        await api.follow("alice", tokens["alice"], "bob")
        await api.follow("carol", tokens["carol"], "dave")

    done = await run_cli(private_azurite, "stats")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # each partition changed once: one counter row each
    assert "table subjectFollowers: 2 follows, 2 internal row(s) (4 rows by account)" in lines
    assert "table subjectFollowing: 2 follows, 2 internal row(s) (4 rows by account)" in lines


async def test_stats_shows_account_deletions_in_progress(
    own: Storage, private_azurite: Azurite, tmp_path: Path
) -> None:
    async with api_client(make_settings(private_azurite.connection_string, tmp_path)) as client:
        token = await Api(client).register("erin")
        assert (await client.delete("/users/erin", headers=bearer(token))).status == 202

    done = await run_cli(private_azurite, "stats")  # no worker here: it stays in progress
    assert done.returncode == 0, done.stderr
    assert "account deletions in progress: 1 (erin)" in done.stdout.splitlines()
