"""Every write is rate limited."""

from __future__ import annotations

from tests.conftest import api_client, make_settings, unique
from tests.helpers import Api, bearer
from timeline.config import Settings


async def test_every_write_is_rate_limited(settings: Settings) -> None:
    limited = make_settings(
        settings.connection_string(), settings.data_dir, writes_per_minute=2,
        registrations_per_minute=3,
    )  # fmt: skip
    async with api_client(limited) as client:
        api = Api(client)
        user, other, third = unique(), unique(), unique()
        token = await api.register(user)
        await api.register(other)
        await api.register(third)
        refused = await client.post("/users", json={"user_id": unique()})
        assert refused.status == 429
        assert "Retry-After" in refused.headers
        await api.follow(user, token, other)
        await api.unfollow(user, token, other)
        for response in (
            await client.put(f"/users/{user}/following/{third}", headers=bearer(token)),
            await client.delete(f"/users/{user}/following/{third}", headers=bearer(token)),
        ):
            assert response.status == 429
            assert (await response.json())["error"]["code"] == "rate_limited"
