"""Upgrading a deployment from before scale-out.

1. The generated auth secret was ``DATA_DIR/auth-secret``; it moved into storage as a new
   random row and the file was ignored: every bearer token issued before the upgrade got a
   401. Fixed: the file, when present, seeds the stored secret.
2. ``timeline init`` with two accounts over a single account's existing data (no placement
   row, no member rows) stored a *settled* placement [A, B] over data that all lived on A:
   about half the users routed to B, where nothing was, and no rebalance would ever move
   them. Fixed: the placement starts on A alone, and ``timeline rebalance`` spreads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import api_client, make_settings
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.azurite import Azurite
from timeline.storage.names import USERS
from timeline.storage.rebalance import Rebalancer


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
