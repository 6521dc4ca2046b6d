"""The workload: seeded random clients posting, deleting, following and unfollowing
through the API."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp

from tests.chaos.report import Report

USERS = 8
CLIENTS = 4


class Clients:
    """Users acting at random through the API; every request is retried like a real client
    would, with the same idempotency key, and may end unanswered (then storage decides)."""

    def __init__(self, session: aiohttp.ClientSession, rng: random.Random, report: Report):
        self._session = session
        self._rng = rng
        self._report = report
        self.tokens: dict[str, str] = {}

    async def register_all(self) -> None:
        for index in range(USERS):
            user = f"user{index}"
            response = await self._request("POST", "/users", json={"user_id": user})
            assert response is not None, "registration failed even after retries"
            self.tokens[user] = response["token"]

    async def act(self, until: float) -> None:
        """Follows outnumber unfollows in the first half and the other way round in the
        second, so authors cross the hybrid threshold up, then back down."""
        loop = asyncio.get_running_loop()
        halfway = until - (until - loop.time()) / 2
        while loop.time() < until:
            await self._one_action(growing=loop.time() < halfway)

    async def _one_action(self, *, growing: bool) -> None:
        rng, users = self._rng, sorted(self.tokens)
        user, other = rng.sample(users, 2)
        roll = rng.random()
        follow_share = 0.3 if growing else 0.1
        if roll < 0.4:
            await self._act(
                "post", "POST", f"/users/{user}/posts", user, {"text": f"t{rng.random()}"}
            )
        elif roll < 0.55:
            await self._delete_one(user)
        elif roll < 0.55 + follow_share:
            await self._act("follow", "PUT", f"/users/{user}/following/{other}", user)
        elif roll < 0.95:
            await self._act("unfollow", "DELETE", f"/users/{user}/following/{other}", user)
        else:
            await self._act("unfollow", "DELETE", f"/users/{user}/following/{other}", user)
            await self._act("follow", "PUT", f"/users/{user}/following/{other}", user)

    async def _delete_one(self, user: str) -> None:
        page = await self._request("GET", f"/users/{user}/posts?limit=20")
        if page and page["items"]:
            post = self._rng.choice(page["items"])["post_id"]
            await self._act("delete", "DELETE", f"/users/{user}/posts/{post}", user)

    async def _act(
        self, kind: str, method: str, path: str, user: str, body: dict[str, str] | None = None
    ) -> None:
        self._report.requests[kind] += 1
        headers = {
            "Authorization": f"Bearer {self.tokens[user]}",
            "Idempotency-Key": f"{kind}-{self._rng.random()}",
        }
        await self._request(method, path, json=body, headers=headers)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer (or {} for 204), or None when every attempt failed or was refused."""
        for _ in range(4):
            try:
                async with self._session.request(method, path, **kwargs) as response:
                    if response.status in (200, 201, 202):
                        return await response.json()
                    if response.status == 204:
                        return {}
                    if response.status == 404:
                        return None  # a post deleted by another client meanwhile
                    assert response.status == 503, f"{method} {path}: {response.status}"
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
        self._report.refused += 1
        return None
