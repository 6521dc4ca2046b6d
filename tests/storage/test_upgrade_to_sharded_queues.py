"""Upgrading a deployment from before scale-out.

1. The generated auth secret was ``DATA_DIR/auth-secret``; it moved into storage as a new
   random row and the file was ignored: every bearer token issued before the upgrade got a
   401. Fixed: the file, when present, seeds the stored secret.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import api_client, make_settings
from timeline.model.tokens import TokenSigner
from timeline.storage.accounts import Storage
from timeline.storage.azurite import Azurite


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
