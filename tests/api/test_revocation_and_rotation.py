"""Tokens can be revoked (one, or all of a user's) and the signing key rotated and retired;
every API process sharing the storage honours each within ``TIMELINE_CREDENTIALS_CACHE_S``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from tests.conftest import TEST_SECRET, api_client, eventually, make_settings, unique
from tests.helpers import bearer, error_of
from timeline.config import Settings
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.tables.credentials import CredentialsRepository
from timeline.tables.secret import retire_key, rotate_key
from timeline.tools.azurite import Azurite

Client = TestClient[Any, Any]
CACHE_S = 0.5


async def _status(client: Client, user: str, token: str) -> int:
    """What an authenticated read answers with this token."""
    response = await client.get(f"/users/{user}/timeline?limit=1", headers=bearer(token))
    return response.status


def _refused_by(client: Client, user: str, token: str) -> Any:
    async def refused() -> bool:
        return await _status(client, user, token) == 401

    return refused


async def _register(client: Client, user: str) -> str:
    response = await client.post("/users", json={"user_id": user})
    assert response.status == 201, await response.text()
    return str((await response.json())["token"])


async def test_revocations_are_honoured_by_every_process(
    settings: Settings, storage: Storage
) -> None:
    quick = make_settings(
        settings.storage_connection_string or "", settings.data_dir, credentials_cache_s=CACHE_S
    )
    user, key = unique(), unique("key")
    async with api_client(quick) as first, api_client(quick) as second:
        registered = await first.post(
            "/users", json={"user_id": user}, headers={"Idempotency-Key": key}
        )
        token = (await registered.json())["token"]
        other = TokenSigner(TEST_SECRET.encode(), token_ttl_s=3600).mint_bearer(user)
        assert await _status(second, user, token) == 200  # the second process caches both
        assert await _status(second, user, other) == 200

        signed_out = await first.delete(f"/users/{user}/tokens/current", headers=bearer(token))
        assert signed_out.status == 204, await signed_out.text()
        assert (
            await error_of(await first.get(f"/users/{user}/timeline", headers=bearer(token)), 401)
            == "revoked_token"
        )
        await eventually(_refused_by(second, user, token), timeout_s=5, what="the sign-out")
        assert await _status(first, user, other) == 200  # one token revoked, not the other
        assert await _status(second, user, other) == 200

        everywhere = await second.delete(f"/users/{user}/tokens", headers=bearer(other))
        assert everywhere.status == 204, await everywhere.text()
        await eventually(_refused_by(first, user, other), timeout_s=5, what="revoke-all")
        assert await _status(second, user, other) == 401
        replay = await first.post(
            "/users", json={"user_id": user}, headers={"Idempotency-Key": key}
        )
        assert await error_of(replay, 409) == "user_exists"  # no token after a revoke-all

        epoch = (await CredentialsRepository(storage).state(user)).epoch
        fresh = TokenSigner(TEST_SECRET.encode(), token_ttl_s=3600).mint_bearer(user, epoch=epoch)
        assert await _status(first, user, fresh) == 200  # `timeline token` mints at the new epoch
        assert await _status(second, user, fresh) == 200


async def test_revoking_needs_the_users_own_token(client: Client) -> None:
    alice, bob = unique("alice"), unique("bob")
    alice_token = await _register(client, alice)
    bob_token = await _register(client, bob)
    for path in (f"/users/{bob}/tokens", f"/users/{bob}/tokens/current"):
        assert (
            await error_of(await client.delete(path, headers=bearer(alice_token)), 403)
            == "forbidden"
        )
        assert await error_of(await client.delete(path), 401) == "missing_token"
    assert await _status(client, bob, bob_token) == 200


async def test_rotation_across_processes(private_azurite: Azurite, tmp_path: Path) -> None:
    """Old tokens stay valid until their key is retired; new tokens use the new key, and a
    process that has not reloaded its ring yet accepts them at once."""
    stored = make_settings(
        private_azurite.connection_string, tmp_path, auth_secret=None, credentials_cache_s=CACHE_S
    )
    slow = make_settings(
        private_azurite.connection_string, tmp_path, auth_secret=None, credentials_cache_s=60
    )
    async with Storage(private_azurite.connection_string) as storage:
        await storage.create_all()
        async with (
            api_client(stored) as first,
            api_client(stored) as second,
            api_client(slow) as lagging,
        ):
            alice, bob = unique("alice"), unique("bob")
            old = await _register(first, alice)
            assert old.split(".")[2] == "1"
            assert await rotate_key(storage, None) == "2"

            async def signs_with_new_key() -> bool:
                return (await _register(second, unique("probe"))).split(".")[2] == "2"

            await eventually(signs_with_new_key, timeout_s=5, what="the new key in use")
            new = await _register(second, bob)
            assert new.split(".")[2] == "2"
            for client in (first, second, lagging):
                assert await _status(client, alice, old) == 200
            assert await _status(first, bob, new) == 200

            async def lagging_accepts_new() -> bool:
                return await _status(lagging, bob, new) == 200

            await eventually(lagging_accepts_new, timeout_s=3, what="an unknown key reloaded")

            await retire_key(storage, None, "1")
            for client in (first, second):
                await eventually(_refused_by(client, alice, old), timeout_s=5, what="retirement")
                assert await _status(client, bob, new) == 200
