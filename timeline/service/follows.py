"""Follows: follow, unfollow, follow requests to locked users, and the public followers and
following listings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from timeline.errors import InvalidInputError, NotFoundError, PermissionDeniedError
from timeline.model.entities import Edge, Page
from timeline.model.keys import validate_user_id
from timeline.model.messages import Followed, Unfollowed
from timeline.service.accounts import require_self, require_user, user_not_found
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
    ) -> bool:
        """Follow (idempotent), or ask to when the subject is locked: False then, and the
        follow starts once the subject approves. ``reposts``: show the subject's reposts (a
        new follow does unless False; on an existing follow, None leaves the choice as it
        was)."""
        require_self(actor, follower)
        _check_subject(follower, subject)
        await self._writes.check(actor)
        locked = await self._users.locked(subject)
        if locked is None:
            raise user_not_found(subject)
        await self._refuse_if_blocked(follower, subject)
        follows = self._follows
        if await follows.is_following(follower, subject):
            if reposts is not None:
                await follows.set_reposts(follower, subject, reposts)
            await follows.repair_index(follower, subject)
            return True
        if locked:  # its message syncs the index row the request makes first, if it died
            async with self._outbox.written(Followed(follower=follower, subject=subject)):
                await follows.request(follower, subject, reposts=reposts is not False)
            if await self._relations.blocked_either(follower, subject):  # a block raced it
                await follows.drop_request(follower, subject)
                await self._refuse_if_blocked(follower, subject)
            return False
        async with self._outbox.written(Followed(follower=follower, subject=subject)):
            await follows.add(follower, subject, datetime.now(UTC), reposts=reposts is not False)
        await self._started(follower, subject)
        return True

    async def _started(self, follower: str, subject: str) -> None:
        """After a follow's write: sync its index, and end it again if a block raced it."""
        await self._follows.sync_index(follower, subject)
        if await self._relations.blocked_either(follower, subject):
            await self.end(follower, subject)
            await self._refuse_if_blocked(follower, subject)

    async def _refuse_if_blocked(self, follower: str, subject: str) -> None:
        """A block either way refuses the follow (403 ``blocked``): two point reads."""
        if await self._relations.blocked_either(follower, subject):
            raise PermissionDeniedError(
                f"{follower} and {subject} cannot follow each other: one blocks the other",
                code="blocked",
            )

    async def approve(self, actor: str, subject: str, follower: str) -> None:
        """Start the follow a request asked for: the request is consumed and the follow
        written in one transaction (``FollowsRepository.approve``), so a withdrawal or
        refusal that came first wins (404, as for no request). Idempotent: with the follow
        already there (a resend, or a follow made while unlocked), it answers as done."""
        require_self(actor, subject)
        _check_subject(subject, follower)
        await self._writes.check(actor)
        follows = self._follows
        request = await follows.request_of(follower, subject)
        if request is None:
            if await follows.is_following(follower, subject):
                return  # approved already (a resend after a lost answer): the follow is there
            raise _no_request(subject, follower)
        await self._refuse_if_blocked(follower, subject)
        async with self._outbox.written(Followed(follower=follower, subject=subject)):
            approved = await follows.approve(follower, subject, request)
        # not approved: withdrawn or refused first, unless a lost answer's resend met its own
        # commit (the follow is there then)
        if not approved and not await follows.is_following(follower, subject):
            raise _no_request(subject, follower)
        await self._started(follower, subject)

    async def refuse(self, actor: str, subject: str, follower: str) -> None:
        """Remove the request (idempotent); an approval after this finds none."""
        require_self(actor, subject)
        _check_subject(subject, follower)
        await self._writes.check(actor)
        await self._follows.drop_request(follower, subject)

    async def requests(
        self, actor: str, subject: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        """The requests waiting for the subject's answer (private)."""
        require_self(actor, subject)
        return await self._pager.listing(
            f"requests:{subject}",
            partial(self._follows.requests_page, subject),
            Edge.to_json,
            limit,
            continuation,
        )

    async def unfollow(self, actor: str, follower: str, subject: str) -> None:
        """Unfollow (idempotent); a request waiting for the subject's answer is withdrawn
        first (an approval after that finds none)."""
        require_self(actor, follower)
        _check_subject(follower, subject)
        await self._writes.check(actor)
        await self._follows.drop_request(follower, subject)
        if not await self._follows.is_following(follower, subject):
            await require_user(self._users, subject)  # an unknown subject is a 404, as for PUT
            await self._follows.repair_index(follower, subject)
            return
        await self.end(follower, subject)

    async def drop_requests(self, one: str, other: str) -> None:
        """Remove any request between the two, either way (a block)."""
        await self._follows.drop_request(one, other)
        await self._follows.drop_request(other, one)

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


def _no_request(subject: str, follower: str) -> NotFoundError:
    return NotFoundError(
        f"{follower!r} has no request to follow {subject!r}", code="follow_request_not_found"
    )


def _check_subject(follower: str, subject: str) -> None:
    """A valid id, not the follower's own: following or unfollowing oneself is a 400."""
    validate_user_id(subject)
    if subject == follower:
        raise InvalidInputError("users cannot follow or unfollow themselves", code="self_follow")
