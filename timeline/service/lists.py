"""Lists: what the API does with them (rows in ``timeline.tables.lists``; a member is a follow
of the list's reader, so fan-out, backfill and purge are a follow's).

A list is its owner's alone: anyone else is answered 404, as if it did not exist.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from functools import partial
from typing import Any

from timeline.errors import ConflictError, InvalidInputError, NotFoundError, PermissionDeniedError
from timeline.model.entities import Edge
from timeline.model.keys import clean_text, list_reader, validate_list_id, validate_user_id
from timeline.model.messages import Followed, ListDeleted, Unfollowed
from timeline.service.accounts import require_user
from timeline.service.outbox import Outbox
from timeline.service.paging import PageOut, Pager
from timeline.service.timelines import Timelines
from timeline.tables.follows import FollowsRepository
from timeline.tables.lists import ListsRepository, UserList
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.relations import RelationsRepository
from timeline.tables.users import UsersRepository

MAX_TITLE_CHARS = 100
MAX_MEMBERS = 5000


class Lists:
    def __init__(
        self,
        users: UsersRepository,
        lists: ListsRepository,
        follows: FollowsRepository,
        relations: RelationsRepository,
        outbox: Outbox,
        pager: Pager,
        timelines: Timelines,
        *,
        writes: RateLimiter,
        max_lists: int,
    ) -> None:
        self._users = users
        self._lists = lists
        self._follows = follows
        self._relations = relations
        self._outbox = outbox
        self._pager = pager
        self._timelines = timelines
        self._writes = writes
        self._max_lists = max_lists

    async def create(self, actor: str, owner: str, title: str, exclusive: bool) -> dict[str, Any]:
        _require_owner(actor, owner)
        cleaned = _title(title)
        await self._writes.check(actor)
        made = await self._lists.create(owner, cleaned, exclusive, self._max_lists)
        if made is None:
            raise ConflictError(
                f"a user holds at most {self._max_lists} lists: delete one first",
                code="too_many_lists",
            )
        return made.to_json()

    async def lists(
        self, actor: str, owner: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        _require_owner(actor, owner)
        return await self._pager.listing(
            f"lists:{owner}",
            partial(self._lists.lists_page, owner),
            UserList.to_json,
            limit,
            continuation,
        )

    async def get(self, actor: str, owner: str, list_id: str) -> dict[str, Any]:
        _require_owner(actor, owner)
        found = await self._lists.get(owner, validate_list_id(list_id))
        if found is None:
            raise _list_not_found(list_id)
        return found.to_json()

    async def update(
        self, actor: str, owner: str, list_id: str, title: str | None, exclusive: bool | None
    ) -> dict[str, Any]:
        """Rename it, or make it exclusive or not (what it leaves out of home changes at
        once: that is read at read time)."""
        _require_owner(actor, owner)
        validate_list_id(list_id)
        cleaned = (
            None if title is None else clean_text(title, max_chars=MAX_TITLE_CHARS, field="title")
        )
        await self._writes.check(actor)
        changed = await self._lists.update(owner, list_id, cleaned, exclusive)
        if changed is None:
            raise _list_not_found(list_id)
        return changed.to_json()

    async def delete(self, actor: str, owner: str, list_id: str) -> None:
        """Remove the list at once (its timeline and members answer 404); its memberships
        end and its timeline goes in the background (``timeline.delivery.lists``)."""
        _require_owner(actor, owner)
        validate_list_id(list_id)
        await self._writes.check(actor)
        if await self._lists.get(owner, list_id) is None:
            raise _list_not_found(list_id)
        async with self._outbox.written(ListDeleted(owner=owner, list_id=list_id)):
            await self._lists.delete(owner, list_id)

    async def add_member(self, actor: str, owner: str, list_id: str, member: str) -> None:
        """Add a user (followed or not, not blocked either way); idempotent. Their newest
        posts and reposts are backfilled, and their new ones reach the list."""
        reader = await self._reader(actor, owner, list_id)
        validate_user_id(member)
        if member == owner:
            raise InvalidInputError("a user cannot be a member of its own list", code="self_member")
        await self._writes.check(actor)
        await require_user(self._users, member)
        if await self._relations.blocked_either(owner, member):
            raise PermissionDeniedError(
                f"{member} cannot be in a list of {owner}: one blocks the other", code="blocked"
            )
        follows = self._follows
        if await follows.is_following(reader, member):
            await follows.repair_index(reader, member)
            return
        if await follows.following_count(reader) >= MAX_MEMBERS:
            raise ConflictError(
                f"a list holds at most {MAX_MEMBERS} members: remove one first",
                code="too_many_members",
            )
        async with self._outbox.written(Followed(follower=reader, subject=member)):
            await follows.sync_index(reader, member)  # first: the list's deletion finds it
            await follows.add(reader, member, datetime.now(UTC))
            await follows.sync_index(reader, member)  # all before the message shows

    async def remove_member(self, actor: str, owner: str, list_id: str, member: str) -> None:
        """Remove a member (idempotent): their entries leave the list in the background."""
        reader = await self._reader(actor, owner, list_id)
        validate_user_id(member)
        await self._writes.check(actor)
        follows = self._follows
        if not await follows.is_following(reader, member):
            await follows.repair_index(reader, member)
            return
        async with self._outbox.written(Unfollowed(follower=reader, subject=member)):
            await follows.remove(reader, member)
            await follows.sync_index(reader, member)  # before the message shows

    async def members(
        self, actor: str, owner: str, list_id: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        reader = await self._reader(actor, owner, list_id)
        return await self._pager.listing(
            f"members:{reader}",
            partial(self._follows.following_page, reader),
            Edge.to_json,
            limit,
            continuation,
        )

    async def timeline(
        self,
        actor: str,
        owner: str,
        list_id: str,
        limit: int | None,
        continuation: str | None,
        since: str | None = None,
    ) -> PageOut:
        """A page of the list's timeline, read beside the list's row (not after it: the page
        costs one round trip, as a home page does), and served only if the row is there."""
        _require_owner(actor, owner)
        validate_list_id(list_id)
        reader = list_reader(owner, list_id)
        found, page = await asyncio.gather(
            self._lists.get(owner, list_id),
            self._timelines.list_timeline(owner, reader, limit, continuation, since),
            return_exceptions=True,
        )
        if isinstance(found, BaseException):
            raise found
        if found is None:
            raise _list_not_found(list_id)
        if isinstance(page, BaseException):
            raise page
        return page

    async def _reader(self, actor: str, owner: str, list_id: str) -> str:
        """The list's reader id, once the actor is found to own the list (404 otherwise)."""
        _require_owner(actor, owner)
        validate_list_id(list_id)
        if await self._lists.get(owner, list_id) is None:
            raise _list_not_found(list_id)
        return list_reader(owner, list_id)


def _require_owner(actor: str, owner: str) -> None:
    """Lists are private: another user is told there is none (404), not that it is hidden."""
    validate_user_id(owner)
    if actor != owner:
        raise NotFoundError(f"{owner!r} has no lists you can see", code="list_not_found")


def _title(title: str) -> str:
    return clean_text(title, max_chars=MAX_TITLE_CHARS, field="title")


def _list_not_found(list_id: str) -> NotFoundError:
    return NotFoundError(f"list {list_id!r} not found", code="list_not_found")
