"""Upgrading a deployment from before scale-out.

1. The work queue was ``fanout`` (with ``fanout-poison``); it is now ``fanout-<k>``. Nothing
   read the old queue, so what it held at the upgrade was never processed -- including
   every delete's and unfollow's delayed second pass: copies of deleted posts stayed in
   timelines for good. Fixed: a worker also consumes ``fanout`` when it exists at start.
2. The generated auth secret was ``DATA_DIR/auth-secret``; it moved into storage as a new
   random row and the file was ignored: every bearer token issued before the upgrade got a
   401. Fixed: the file, when present, seeds the stored secret.
3. ``timeline init`` with two accounts over a single account's existing data (no placement
   row, no member rows) stored a *settled* placement [A, B] over data that all lived on A:
   about half the users routed to B, where nothing was, and no rebalance would ever move
   them. Fixed: the placement starts on A alone, and ``timeline rebalance`` spreads it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import api_client, eventually, make_settings, running_worker
from timeline.model.keys import new_post_id, now_ticks
from timeline.model.messages import PostDeleted, encode
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.azurite import Azurite
from timeline.storage.names import LEGACY_SHARD, USERS
from timeline.storage.queue import FanoutQueue
from timeline.storage.rebalance import Rebalancer


async def test_messages_left_in_the_old_fanout_queue_are_processed(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    """A delete's first pass, and another delete's second pass still invisible, left in
    ``fanout``: both run to the end (the first pass's own second pass included)."""
    settings = make_settings(
        private_azurite.connection_string,
        tmp_path,
        storage_timeout_s=1.0,
        worker_write_deadline_s=1.0,
        worker_sweep_delay_s=2.5,  # a delete's second pass comes back 2.5 s after its first
    )
    async with Storage(private_azurite.connection_string) as storage:
        await storage.create_all()  # `timeline init` of the new version
        legacy = storage.work_queue(LEGACY_SHARD)
        legacy_poison = storage.poison_queue(LEGACY_SHARD)
        await legacy.create_queue()  # what the previous version left behind...
        await legacy_poison.create_queue()
        first_pass = PostDeleted(author="alice", post_id=new_post_id(now_ticks()))
        second_pass = PostDeleted(author="bob", post_id=new_post_id(now_ticks()), confirm=True)
        await legacy.send_message(encode(first_pass))  # ...with deletes in it
        await legacy.send_message(encode(second_pass), visibility_timeout=2)

        async def depths() -> tuple[int, int]:
            work = await legacy.get_queue_properties()
            poison = await legacy_poison.get_queue_properties()
            return work.approximate_message_count or 0, poison.approximate_message_count or 0

        async def drained() -> bool:
            return await depths() == (0, 0)

        try:
            async with running_worker(settings):
                await eventually(drained, timeout_s=30, what="the old 'fanout' queue drained")
        except AssertionError:
            left, poisoned = await depths()
            pytest.fail(
                f"{left} message(s) in the old 'fanout' queue are never processed "
                f"({poisoned} poisoned)"
            )
        finally:
            await legacy.close()
            await legacy_poison.close()


async def test_tokens_signed_with_the_old_secret_file_still_work(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    old_secret = "the-secret-the-previous-version-generated"
    (tmp_path / "auth-secret").write_text(old_secret)
    os.chmod(tmp_path / "auth-secret", 0o600)
    settings = make_settings(private_azurite.connection_string, tmp_path, auth_secret=None)
    async with Storage(private_azurite.connection_string) as storage:
        await storage.create_all()
    token = TokenSigner(old_secret.encode(), token_ttl_s=3600).mint_bearer("alice")
    async with api_client(settings) as client:
        response = await client.get(
            "/users/alice/timeline", headers={"Authorization": f"Bearer {token}"}
        )
    assert response.status != 401, "every token issued before the upgrade is refused"


async def _reachable(storage: Storage, users: list[str]) -> int:
    reachable = 0
    for user in users:
        async with storage.guard():
            rows = [
                e
                async for e in storage.reader(USERS, user).query_entities(
                    "PartitionKey eq @p", parameters={"p": user}
                )
            ]
        reachable += bool(rows)
    return reachable


async def _no_fence(_seconds: float) -> None:
    """One process only: nothing else routes, so the fences need not be waited."""


async def test_init_with_two_accounts_over_existing_single_account_data_keeps_it_reachable(
    two_azurites: list[Azurite],
) -> None:
    """A deployment of the previous version (data on A, no placement row, no member rows)
    follows docs/operations.md's "Running on real Azure" recipe with two accounts: ``timeline
    init`` must keep every existing user reachable, and ``timeline rebalance`` then spreads
    them over both."""
    a, b = two_azurites
    users = [f"user-{n}" for n in range(20)]
    async with Storage(a.connection_string) as legacy:
        # What the previous version left: tables and rows on A, no placement.
        client = legacy.account_table(0, USERS)
        await client.create_table()
        for user in users:
            await client.upsert_entity({"PartitionKey": user, "RowKey": "profile"})
    async with Storage([a.connection_string, b.connection_string]) as grown:
        await grown.create_all()  # `timeline init` with the two accounts
        reachable = await _reachable(grown, users)
        assert reachable == 20, f"only {reachable} of 20 existing users are reachable after init"
        assert grown.placement.accounts == grown.account_ids[:1], "init did not start on A alone"
        await Rebalancer(grown, margin_s=0, steps=1, progress=False, sleep=_no_fence).run()
        spread = await grown.refresh_placement()
        assert spread is not None
        assert spread.settled, "the rebalance did not finish"
        assert spread.accounts == grown.account_ids, "the rebalance did not spread it"
        reachable = await _reachable(grown, users)
        assert reachable == 20, f"only {reachable} of 20 existing users are reachable after it"
        async with grown.guard():
            on_b = [e async for e in grown.account_table(1, USERS).list_entities()]
        assert on_b, "the rebalance moved nothing onto the second account"


async def test_deleting_the_old_queue_under_a_running_worker_does_not_stop_it(
    private_azurite: Azurite, tmp_path: Path
) -> None:
    """docs/scale-out.md says to delete `fanout` once drained: a worker polling it carries on."""
    settings = make_settings(private_azurite.connection_string, tmp_path)
    async with Storage(settings.connection_string()) as storage:
        await storage.create_all()
        await storage.work_queue(LEGACY_SHARD).create_queue()
        await storage.poison_queue(LEGACY_SHARD).create_queue()
        shard = FanoutQueue(storage, 0)
        async with running_worker(settings):
            for poisoned_so_far in (1, 2):
                await shard.send_raw("not a message")  # poisoned once the worker reads it

                async def poisoned(expected: int = poisoned_so_far) -> bool:
                    return await shard.depth() == (0, expected)

                await eventually(poisoned, what="the worker consuming its shard")
                if poisoned_so_far == 1:  # the worker polls both queues by now
                    await storage.work_queue(LEGACY_SHARD).delete_queue()
