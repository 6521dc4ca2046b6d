"""The workload: seeded random clients posting, deleting, following and unfollowing
through the API, and readers reading their home timelines on a schedule that lets some go
dormant and come back mid-run."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tests.chaos.cluster import INACTIVE_S
from tests.chaos.report import Report

USERS = 8
CLIENTS = 4
READ_PAGE = 7
ACTIVE, RETURNS, GONE = "active", "returns", "gone"
"""Reading schedules: reads all along; stops early and comes back once dormant; never reads
(registration stamped it, so it goes dormant) until the end-state reads."""
SILENCE_S = 2 * INACTIVE_S + 2.5
"""How long a returning reader stays away: the inactive period, the stamp's granularity, a
sweep interval and the marks, with room to spare."""

Peek = Callable[[str], Awaitable[str | None]]
"""A reader's dormancy state as stored (``dormant``, ``waking``, or None)."""


class Clients:
    """Users acting at random through the API; every request is retried like a real client
    would, with the same idempotency key, and may end unanswered (then storage decides)."""

    def __init__(self, session: aiohttp.ClientSession, rng: random.Random, report: Report):
        self._session = session
        self._rng = rng
        self._report = report
        self.tokens: dict[str, str] = {}
        self.schedules: dict[str, str] = {}

    async def register_all(self) -> None:
        for index in range(USERS):
            user = f"user{index}"
            response = await self._request("POST", "/users", json={"user_id": user})
            assert response is not None, "registration failed even after retries"
            self.tokens[user] = response["token"]
        users = sorted(self.tokens)
        kinds = [ACTIVE, ACTIVE, RETURNS, RETURNS, RETURNS, GONE]
        kinds += [self._rng.choice(kinds) for _ in range(len(users) - len(kinds))]
        self._rng.shuffle(kinds)
        self.schedules = dict(zip(users, kinds, strict=True))

    async def read_loop(self, until: float, peek: Peek) -> None:
        """Read the home timelines of the readers awake now, over and over: returning
        readers stop after the first 15% of the run and come back ``SILENCE_S`` later."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        leave = start + 0.15 * (until - start)
        back = leave + max(SILENCE_S, 0.35 * (until - start))
        while loop.time() < until:
            now = loop.time()
            for user, kind in self.schedules.items():
                if kind == ACTIVE or (kind == RETURNS and not leave <= now < back):
                    await self.read(user, peek)
            await asyncio.sleep(self._rng.uniform(0.2, 0.5))

    async def read(self, user: str, peek: Peek) -> dict[str, str] | None:
        """The whole home timeline through the API, paged as a client pages it: post id to
        text (None if a page failed); counts the reads by the state the reader was in."""
        try:
            state = await peek(user)
        except Exception:
            state = "unknown"
        self._report.reads[state or "active"] += 1
        served: dict[str, str] = {}
        query: dict[str, str | int] = {"limit": READ_PAGE}
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        while True:
            page = await self._request(
                "GET", f"/users/{user}/timeline", params=query, headers=headers
            )
            if not page:
                return None
            for item in page["items"]:
                assert item["post_id"] not in served, f"{user}: a repeat across pages"
                served[item["post_id"]] = item["text"]
            if not page.get("continuation"):
                return served
            query = {"limit": READ_PAGE, "continuation": page["continuation"]}

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
