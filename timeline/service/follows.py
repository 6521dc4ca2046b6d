"""Follows: follow, unfollow, and the public followers and following listings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from timeline.errors import InvalidInputError, PermissionDeniedError
from timeline.model.entities import Edge, Page
from timeline.model.keys import validate_user_id
from timeline.model.messages import Followed, Unfollowed
from timeline.service.accounts import require_self, require_user
from timeline.service.outbox import Outbox
from timeline.service.paging import PageOut, Pager
from timeline.tables.follows import FollowsRepository
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.relations import RelationsRepository
from timeline.tables.users import UsersRepository

T = TypeVar("T")


class Follows:
    """Each change is written, then its message released (``timeline.service.outbox``); a
    request that finds the change already made only repairs the index."""

    def __init__(
        self,
        users: UsersRepository,
        follows: FollowsRepository,
        outbox: Outbox,
        pager: Pager,
        *,
        relations: RelationsRepository,
        writes: RateLimiter,
    ) -> None:
        self._relations = relations
        self._users = users
        self._follows = follows
        self._outbox = outbox
        self._pager = pager
        self._writes = writes

    async def follow(
        self, actor: str, follower: str, subject: str, *, reposts: bool | None = None
    ) -> None:
        """Follow (idempotent); ``reposts``: show the subject's reposts (a new follow does
        unless False; on an existing follow, None leaves the choice as it was)."""
        require_self(actor, follower)
        _check_subject(follower, subject)
        await self._writes.check(actor)
        await require_user(self._users, subject)
        await self._refuse_if_blocked(follower, subject)
        follows = self._follows
        if await follows.is_following(follower, subject):
            if reposts is not None:
                await follows.set_reposts(follower, subject, reposts)
            await follows.repair_index(follower, subject)
            return
        async with self._outbox.written(Followed(follower=follower, subject=subject)):
            await follows.add(follower, subject, datetime.now(UTC), reposts=reposts is not False)
        await follows.sync_index(follower, subject)
        if await self._relations.blocked_either(follower, subject):  # a block raced this follow
            await self.end(follower, subject)
            await self._refuse_if_blocked(follower, subject)

    async def _refuse_if_blocked(self, follower: str, subject: str) -> None:
        """A block either way refuses the follow (403 ``blocked``): two point reads."""
        if await self._relations.blocked_either(follower, subject):
            raise PermissionDeniedError(
                f"{follower} and {subject} cannot follow each other: one blocks the other",
                code="blocked",
            )

    async def unfollow(self, actor: str, follower: str, subject: str) -> None:
        require_self(actor, follower)
        _check_subject(follower, subject)
        await self._writes.check(actor)
        if not await self._follows.is_following(follower, subject):
            await require_user(self._users, subject)  # an unknown subject is a 404, as for PUT
            await self._follows.repair_index(follower, subject)
            return
        await self.end(follower, subject)

    async def end(self, follower: str, subject: str) -> None:
        """End a follow through the unfollow path (the change, then its message), with no
        actor or rate check: an unfollow, or a block ending a follow either way."""
        follows = self._follows
        if not await follows.is_following(follower, subject):
            await follows.repair_index(follower, subject)
            return
        async with self._outbox.written(Unfollowed(follower=follower, subject=subject)):
            await follows.remove(follower, subject)
        await follows.sync_index(follower, subject)

    async def followers(self, user_id: str, limit: int | None, continuation: str | None) -> PageOut:
        return await self._public_listing(
            "followers", user_id, self._follows.followers_page, Edge.to_json, limit, continuation
        )

    async def following(self, user_id: str, limit: int | None, continuation: str | None) -> PageOut:
        return await self._public_listing(
            "following", user_id, self._follows.following_page, Edge.to_json, limit, continuation
        )

    async def _public_listing(
        self,
        kind: str,
        user_id: str,
        fetch: Callable[[str, int, dict[str, str] | None], Awaitable[Page[T]]],
        to_json: Callable[[T], dict[str, Any]],
        limit: int | None,
        continuation: str | None,
    ) -> PageOut:
        """A page of a user's public list; an empty first page of an unknown user is a 404."""
        scope = f"{kind}:{validate_user_id(user_id)}"
        pager = self._pager
        page = await fetch(user_id, pager.limit(limit), pager.continuation(scope, continuation))
        if not page.items and continuation is None:
            await require_user(self._users, user_id)
        return pager.page_out(scope, page, to_json)


def _check_subject(follower: str, subject: str) -> None:
    """A valid id, not the follower's own: following or unfollowing oneself is a 400."""
    validate_user_id(subject)
    if subject == follower:
        raise InvalidInputError("users cannot follow or unfollow themselves", code="self_follow")
