"""The workload: seeded random clients posting, replying, deleting, following (some with
``reposts=false``) and unfollowing, reposting and undoing it, blocking, muting (some for a
few seconds) and lifting both, making lists (some exclusive), adding and removing members
(followed or not), toggling ``exclusive`` and deleting lists, deleting one account while
the others go on acting on it, all through the API, and readers
reading their home timelines on a schedule that lets some go dormant and come back mid-run
(and their lists' timelines all along)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp

from tests.chaos.cluster import INACTIVE_S
from tests.chaos.report import Report
from timeline.model.keys import list_reader

USERS = 8
CLIENTS = 4
READ_PAGE = 7
ACTIVE, RETURNS, GONE = "active", "returns", "gone"
"""Reading schedules: reads all along; stops early and comes back once dormant; never reads
(registration stamped it, so it goes dormant) until the end-state reads."""
SILENCE_S = 2 * INACTIVE_S + 2.5
"""How long a returning reader stays away: the inactive period, the stamp's granularity, a
sweep interval and the marks, with room to spare."""

MUTE_SHORT_S = 5.0
"""The longest short mute: it ends within the run or while the queues drain."""
LIST_ACTIONS = (
    "list", "list_member", "list_member", "list_exclusive", "list_member", "list_unmember",
    "list_member", "list", "list_member", "list_delete", "list_member", "list_exclusive",
)  # fmt: skip
"""The list actions in turn: adds most, a deletion every twelve (racing the other clients'
adds and reads of that list)."""
LISTS_PER_OWNER = 3
"""An owner makes no more lists than this (an add is made instead)."""
RELATE = (
    "repost", "mute", "block", "repost", "lock", "filter", "unrepost", "repost", "answer",
    "unmute", "unblock", "repost", "mute", "unfilter", "unrepost", "repost", "unlock",
    "answer",
)  # fmt: skip
WORDS = ("cat", "dog", "sun", "rain")
"""Posts end with one of these; keyword filters name one."""
"""The relation actions in turn: reposts most, a mute every six, a block every twelve (each
ends follows both ways: more would keep authors from crossing the hybrid threshold)."""
Item = dict[str, Any]
"""A home timeline entry as the API serves it."""

Peek = Callable[[str], Awaitable[str | None]]
"""A reader's dormancy state as stored (``dormant``, ``waking``, or None)."""

DELETION_AT = 0.6
"""When a client deletes an account: this share of the run before its end."""

RESTART_WAIT_S = 20.0
"""How long a request waits for an API that refuses connections (``apikill`` restarts it) before
it counts as refused: a restart on a loaded machine takes seconds."""


class Clients:
    """Users acting at random through the API; every request is retried like a real client
    would, with the same idempotency key, and may end unanswered (then storage decides)."""

    def __init__(self, session: aiohttp.ClientSession, rng: random.Random, report: Report):
        self._session = session
        self._rng = rng
        self._report = report
        self.tokens: dict[str, str] = {}
        self.schedules: dict[str, str] = {}
        self.asked_to_follow: set[tuple[str, str]] = set()
        """Every (follower, target) pair a follow was ever sent for."""
        self.reply_targets: dict[str, str] = {}
        """Each reply's text (unique) to the user it answers: the truth's, once a deletion
        has made a reply answer nobody."""
        self.asked_to_add: set[tuple[str, str]] = set()
        """Every (list reader, member) pair an add was ever sent for."""
        self.lists: dict[str, dict[str, bool]] = {}
        """Owner to the lists it made and has not deleted (as far as the answers tell) to
        whether each was last made exclusive."""
        self.reposted: dict[str, list[str]] = {}
        self.short_expiry = 0.0
        """The latest short mute expiry asked for (epoch seconds)."""
        self._relates = 0
        self._list_actions = 0
        self.deleting: set[str] = set()
        """The users whose account a client has asked to delete (storage says which were)."""

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
                if user in self.deleting:
                    continue
                if kind == ACTIVE or (kind == RETURNS and not leave <= now < back):
                    await self.read(user, peek)
            known = self.known_lists()
            if known:
                await self.read_list(*self._rng.choice(known))
            await asyncio.sleep(self._rng.uniform(0.2, 0.5))

    async def read(self, user: str, peek: Peek) -> list[list[Item]] | None:
        """The whole home timeline through the API, paged as a client pages it (None if a
        page failed); counts the reads by the state the reader was in. Mid-run, only what
        holds at every moment is checked: no post twice in a page, no plain entry twice."""
        try:
            state = await peek(user)
        except Exception:
            state = "unknown"
        self._report.reads[state or "active"] += 1
        return await self._timeline(user, f"/users/{user}/timeline", user)

    async def read_list(self, owner: str, list_id: str) -> list[list[Item]] | None:
        """The whole timeline of one of ``owner``'s lists, read by its owner, as ``read``
        reads a home timeline (None if a page failed: the list may be deleted meanwhile)."""
        self._report.list_reads += 1
        path = f"/users/{owner}/lists/{list_id}/timeline"
        return await self._timeline(owner, path, list_reader(owner, list_id))

    def known_lists(self) -> list[tuple[str, str]]:
        """(owner, list id) of the lists made and not deleted, as far as the answers tell."""
        return sorted(
            (owner, found)
            for owner, made in self.lists.items()
            for found in made
            if owner not in self.deleting
        )

    async def _timeline(self, user: str, path: str, label: str) -> list[list[Item]] | None:
        pages: list[list[Item]] = []
        plain: set[str] = set()
        query: dict[str, str | int] = {"limit": READ_PAGE}
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        while True:
            page = await self._request("GET", path, params=query, headers=headers, actor=user)
            if not page:
                return None
            ids = [item["post_id"] for item in page["items"]]
            assert len(set(ids)) == len(ids), f"{label}: a post twice in a page: {ids}"
            for item in page["items"]:
                if "reposted_by" not in item:
                    assert item["post_id"] not in plain, f"{label}: a repeat across pages"
                    plain.add(item["post_id"])
            pages.append(page["items"])
            if not page.get("continuation"):
                return pages
            query = {"limit": READ_PAGE, "continuation": page["continuation"]}

    async def author_page(self, author: str, reader: str | None) -> list[str] | None:
        """Every post id on ``author``'s page as ``reader`` (None: anonymous) reads it, every
        page (None if a page failed)."""
        headers = {} if reader is None else {"Authorization": f"Bearer {self.tokens[reader]}"}
        ids: list[str] = []
        query: dict[str, str | int] = {"limit": 100}
        while True:
            page = await self._request(
                "GET", f"/users/{author}/posts", params=query, headers=headers
            )
            if not page:
                return None
            ids += [item["post_id"] for item in page["items"]]
            if not page.get("continuation"):
                return ids
            query = {"limit": 100, "continuation": page["continuation"]}

    async def act(self, until: float) -> None:
        """Follows outnumber unfollows in the first half and the other way round in the
        second, so authors cross the hybrid threshold up, then back down."""
        loop = asyncio.get_running_loop()
        halfway = until - (until - loop.time()) / 2
        deletion_at = until - DELETION_AT * (until - loop.time())
        while loop.time() < until:
            if not self.deleting and loop.time() > deletion_at:
                await self._delete_an_account()
            await self._one_action(growing=loop.time() < halfway)

    async def _delete_an_account(self) -> None:
        """Delete one user's account (once a run), while the other clients go on acting on
        it: following it, reposting and answering its posts, adding it to lists."""
        user = self._rng.choice(sorted(self.tokens))
        self.deleting.add(user)
        await self._act("delete_account", "DELETE", f"/users/{user}", user)

    async def _one_action(self, *, growing: bool) -> None:
        rng, users = self._rng, sorted(self.tokens)
        user = rng.choice([u for u in users if u not in self.deleting])
        other = rng.choice([u for u in users if u != user])
        roll = rng.random()
        follow_share = 0.3 if growing else 0.08
        if roll < 0.2:
            body = {"text": f"t{rng.random()} {rng.choice(WORDS)}"}
            if rng.random() < 0.25:
                body["visibility"] = "followers"
            await self._act("post", "POST", f"/users/{user}/posts", user, body)
        elif roll < 0.28:
            await self._reply(user, other)
        elif roll < 0.36:
            await self._delete_one(user)
        elif roll < 0.50:
            await self._relate(user, other)
        elif roll < 0.56:
            await self._list_action(user, other)
        elif roll < 0.56 + follow_share:
            await self._follow(user, other)
        elif roll < 0.95:
            await self._act("unfollow", "DELETE", f"/users/{user}/following/{other}", user)
        else:
            await self._act("unfollow", "DELETE", f"/users/{user}/following/{other}", user)
            await self._follow(user, other)

    async def _follow(self, user: str, other: str) -> None:
        """A follow, one in five hiding the target's reposts, one in ten showing them again."""
        self.asked_to_follow.add((user, other))
        roll = self._rng.random()
        choice = "?reposts=false" if roll < 0.2 else "?reposts=true" if roll < 0.3 else ""
        kind = "follow" if not choice else f"follow{choice[1:]}"
        await self._act(kind, "PUT", f"/users/{user}/following/{other}{choice}", user)

    async def _relate(self, user: str, other: str) -> None:
        """A repost or its undo, a block or unblock, a mute or unmute: in turn (``RELATE``),
        so even a short run makes each."""
        kind = RELATE[self._relates % len(RELATE)]
        self._relates += 1
        if kind == "repost":
            post = await self._pick_post(self._rng.choice([user, other, other]))
            if post is not None:
                self.reposted.setdefault(user, []).append(post["post_id"])
                body = {"author": post["author"], "post_id": post["post_id"]}
                await self._act("repost", "POST", f"/users/{user}/reposts", user, body)
        elif kind == "unrepost":
            if self.reposted.get(user):
                post_id = self._rng.choice(self.reposted[user])
                await self._act("unrepost", "DELETE", f"/users/{user}/reposts/{post_id}", user)
        elif kind == "mute":
            await self._act("mute", "PUT", f"/users/{user}/mutes/{other}", user, self._mute())
        elif kind in ("lock", "unlock"):
            body = {"locked": kind == "lock"}
            await self._act(kind, "PATCH", f"/users/{user}", user, body)
        elif kind == "answer":
            await self._answer(user)
        elif kind == "filter":
            body = {"phrase": self._rng.choice(WORDS).upper()}
            await self._act("filter", "POST", f"/users/{user}/filters", user, body)
        elif kind == "unfilter":
            await self._unfilter(user)
        else:
            method = "PUT" if kind == "block" else "DELETE"
            noun = "blocks" if kind.endswith("block") else "mutes"
            await self._act(kind, method, f"/users/{user}/{noun}/{other}", user)

    async def _list_action(self, user: str, other: str) -> None:
        """Make a list (half of them exclusive), add a member (following it first: always for
        an exclusive list, so it has something to keep out of home, else half the time) or
        remove one, toggle ``exclusive``, or delete a list (one whose timeline shows entries,
        if one of the two tried does): in turn (``LIST_ACTIONS``). All but making one act on
        a list some client made (any owner's: the clients race each other on it)."""
        kind = LIST_ACTIONS[self._list_actions % len(LIST_ACTIONS)]
        self._list_actions += 1
        known = self.known_lists()
        if (kind == "list" and len(self.lists.get(user, {})) < LISTS_PER_OWNER) or not known:
            exclusive = self._rng.random() < 0.5
            body = {"title": f"l{self._rng.random()}", "exclusive": exclusive}
            made = await self._act("list", "POST", f"/users/{user}/lists", user, body)
            if made:
                self.lists.setdefault(user, {})[made["list_id"]] = exclusive
            return
        owner, list_id = self._rng.choice(known)
        path = f"/users/{owner}/lists/{list_id}"
        member = other if other != owner else user
        if kind in ("list", "list_member"):
            if self.lists[owner].get(list_id) or self._rng.random() < 0.5:
                await self._follow(owner, member)  # what an exclusive list is made for
            self.asked_to_add.add((list_reader(owner, list_id), member))
            await self._act("list_member", "PUT", f"{path}/members/{member}", owner)
        elif kind == "list_unmember":
            await self._act("list_unmember", "DELETE", f"{path}/members/{member}", owner)
        elif kind == "list_exclusive":
            exclusive = not self.lists[owner].get(list_id, False)
            if list_id in self.lists[owner]:  # else deleted meanwhile: the PATCH gets 404
                self.lists[owner][list_id] = exclusive
            body = {"exclusive": exclusive}
            await self._act("list_exclusive", "PATCH", path, owner, body)
        else:
            pages = await self.read_list(owner, list_id)  # what the deletion must remove
            if not any(pages or []):
                owner, list_id = self._rng.choice(known)
                path = f"/users/{owner}/lists/{list_id}"
                pages = await self.read_list(owner, list_id)
            self._report.deleted_with_entries += any(pages or [])
            self.lists[owner].pop(list_id, None)
            await self._act("list_delete", "DELETE", path, owner)

    async def _answer(self, owner: str) -> None:
        """Approve (two in three) or refuse one of the requests waiting for ``owner``."""
        headers = {"Authorization": f"Bearer {self.tokens[owner]}"}
        page = await self._request(
            "GET",
            f"/users/{owner}/follow_requests",
            headers=headers,
            actor=owner,
        )
        if page and page["items"]:
            follower = self._rng.choice(page["items"])["user_id"]
            kind = "approve" if self._rng.random() < 2 / 3 else "refuse"
            method = "PUT" if kind == "approve" else "DELETE"
            await self._act(kind, method, f"/users/{owner}/follow_requests/{follower}", owner)

    async def _unfilter(self, owner: str) -> None:
        headers = {"Authorization": f"Bearer {self.tokens[owner]}"}
        page = await self._request("GET", f"/users/{owner}/filters", headers=headers, actor=owner)
        if page and page["items"]:
            found = self._rng.choice(page["items"])["filter_id"]
            await self._act("unfilter", "DELETE", f"/users/{owner}/filters/{found}", owner)

    def _mute(self) -> dict[str, Any]:
        """A mute's body: with or without reposts; no expiry, a short one, or a long one."""
        body: dict[str, Any] = {"reposts": self._rng.random() < 0.6}
        roll = self._rng.random()
        if roll < 0.4:
            at = time.time() + self._rng.uniform(1.0, MUTE_SHORT_S)
            self.short_expiry = max(self.short_expiry, at)
            body["expires_at"] = datetime.fromtimestamp(at, UTC).isoformat()
        elif roll < 0.6:
            body["expires_at"] = datetime.fromtimestamp(time.time() + 3600, UTC).isoformat()
        return body

    async def _reply(self, user: str, other: str) -> None:
        """A reply to one of ``other``'s newest posts (followed by ``user`` or not), or now
        and then to its own (a thread)."""
        target = other if self._rng.random() < 0.85 else user
        post = await self._pick_post(target)
        if post is not None:
            text = f"r{self._rng.random()}"
            self.reply_targets[text] = target
            body = {"text": text, "reply_to": {"author": target, "post_id": post["post_id"]}}
            await self._act("reply", "POST", f"/users/{user}/posts", user, body)

    async def _delete_one(self, user: str) -> None:
        post = await self._pick_post(user)
        if post is not None:
            path = f"/users/{user}/posts/{post['post_id']}"
            await self._act("delete", "DELETE", path, user)

    async def _pick_post(self, author: str) -> dict[str, Any] | None:
        page = await self._request("GET", f"/users/{author}/posts?limit=20")
        return self._rng.choice(page["items"]) if page and page["items"] else None

    async def _act(
        self, kind: str, method: str, path: str, user: str, body: dict[str, Any] | None = None
    ) -> Any:
        """The answer (``_request``)."""
        self._report.requests[kind] += 1
        headers = {
            "Authorization": f"Bearer {self.tokens[user]}",
            "Idempotency-Key": f"{kind}-{self._rng.random()}",
        }
        return await self._request(method, path, json=body, headers=headers, actor=user)

    async def _request(
        self, method: str, path: str, *, actor: str | None = None, **kwargs: Any
    ) -> Any:
        """The JSON answer (or {} for 204), or None when every attempt failed or was refused
        (a 401 is the answer for an ``actor`` whose account another client is deleting:
        asked when the answer comes, since a request retried through a 503 may meet a
        deletion that began after it was first sent)."""
        attempts, restarting_until = 0, asyncio.get_running_loop().time() + RESTART_WAIT_S
        while attempts < 4:
            try:
                async with self._session.request(method, path, **kwargs) as response:
                    if response.status in (200, 201, 202):
                        return await response.json()
                    if response.status == 204:
                        return {}
                    if response.status == 404:
                        return None  # a post deleted by another client meanwhile
                    if response.status == 401 and actor in self.deleting:
                        return None
                    if response.status in (403, 409) and (await response.json())["error"][
                        "code"
                    ] in ("blocked", "not_repostable", "too_many_filters", "too_many_lists"):
                        return None  # refused by a block, a followers-only post, a cap
                    if response.status == 400 and attempts and _expired(kwargs.get("json")):
                        return None  # a short mute retried through 503s past its expiry
                    assert response.status == 503, f"{method} {path}: {response.status}"
            except aiohttp.ClientConnectorError:  # nothing sent: the API is restarting
                if asyncio.get_running_loop().time() < restarting_until:
                    await asyncio.sleep(0.2)
                    continue
            except (aiohttp.ClientError, TimeoutError):
                pass
            attempts += 1
            await asyncio.sleep(0.2)
        self._report.refused += 1
        return None


def _expired(body: dict[str, Any] | None) -> bool:
    """Whether ``body`` names an expiry that has passed (a retry sends the first body)."""
    at = (body or {}).get("expires_at")
    return at is not None and datetime.fromisoformat(at).timestamp() <= time.time()
