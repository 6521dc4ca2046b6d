"""Blocks, mutes and keyword filters: what the API does with them (rows in
``timeline.tables.relations``; the read-time filter in ``timeline.reads.hidden``)."""

from __future__ import annotations

import re
import time
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from functools import partial
from typing import Any

from timeline.errors import (
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
)
from timeline.model.keys import (
    POST_ID_PATTERN,
    clean_text,
    format_time,
    validate_user_id,
)
from timeline.model.messages import RelationChanged
from timeline.model.phrases import MAX_PHRASE_TOKENS, tokens
from timeline.service.accounts import require_self, require_user
from timeline.service.follows import Follows
from timeline.service.outbox import Outbox
from timeline.service.paging import PageOut, Pager
from timeline.tables.ratelimits import RateLimiter
from timeline.tables.relations import (
    BLOCK,
    MAX_BLOCKS,
    MAX_FILTERS,
    MAX_MUTES,
    MUTED,
    Filter,
    Mute,
    RelationKind,
    RelationsRepository,
)
from timeline.tables.users import UsersRepository

MAX_EXPIRY_S = 100 * 365 * 86_400
"""The furthest a mute's or filter's expiry may lie ahead (one with no end takes ``null``)."""
MAX_PHRASE_CHARS = 100
_FILTER_ID = re.compile(POST_ID_PATTERN.replace("$", r"\Z"))


class Relations:
    """A block writes its rows, then ends the follows either way through the unfollow path
    (so their purges and guarantees are the unfollow's); a mute is one row, read at read time."""

    def __init__(
        self,
        users: UsersRepository,
        relations: RelationsRepository,
        follows: Follows,
        outbox: Outbox,
        pager: Pager,
        *,
        writes: RateLimiter,
    ) -> None:
        self._users = users
        self._relations = relations
        self._follows = follows
        self._outbox = outbox
        self._pager = pager
        self._writes = writes

    async def block(self, actor: str, blocker: str, other: str) -> None:
        """Idempotent: a repeated block (say after a lost answer) ends the follows again."""
        await self._check(actor, blocker, other, "block")
        await require_user(self._users, other)
        if not await self._relations.blocks(blocker, other):
            await self._refuse_past_cap(blocker, BLOCK, MAX_BLOCKS, "blocks")
        async with self._changing("block", blocker, other):
            await self._relations.block(blocker, other)
        await self._follows.end(blocker, other)  # after the rows: see docs/guarantees.md
        await self._follows.end(other, blocker)
        await self._follows.drop_requests(blocker, other)

    async def unblock(self, actor: str, blocker: str, other: str) -> None:
        await self._check(actor, blocker, other, "block")
        if not await self._relations.blocks(blocker, other):
            await require_user(self._users, other)
        async with self._changing("block", blocker, other):
            await self._relations.unblock(blocker, other)

    async def mute(
        self, actor: str, muter: str, other: str, expires_at: datetime | None, reposts: bool
    ) -> None:
        """Record or replace the mute; an expiry must be in the future."""
        await self._check(actor, muter, other, "mute")
        until = _until(expires_at)
        await require_user(self._users, other)
        if await self._relations.mute_of(muter, other) is None:
            await self._refuse_past_cap(muter, MUTED, MAX_MUTES, "mutes")
        async with self._changing("mute", muter, other):
            await self._relations.mute(muter, other, until, reposts)

    async def unmute(self, actor: str, muter: str, other: str) -> None:
        await self._check(actor, muter, other, "mute")
        if await self._relations.mute_of(muter, other) is None:
            await require_user(self._users, other)
        async with self._changing("mute", muter, other):
            await self._relations.unmute(muter, other)

    async def add_filter(
        self, actor: str, owner: str, phrase: str, expires_at: datetime | None
    ) -> dict[str, Any]:
        """A new keyword filter: it hides matching entries from the owner's reads at once."""
        require_self(actor, owner)
        cleaned = clean_text(phrase, max_chars=MAX_PHRASE_CHARS, field="phrase")
        if len(tokens(cleaned)) > MAX_PHRASE_TOKENS:
            raise InvalidInputError(
                f"a phrase holds at most {MAX_PHRASE_TOKENS} words and other characters",
                code="invalid_phrase",
            )
        until = _until(expires_at)
        await self._writes.check(actor)
        found = await self._relations.add_filter(owner, cleaned, until)
        if found is None:
            raise ConflictError(
                f"a user holds at most {MAX_FILTERS} filters: remove one first",
                code="too_many_filters",
            )
        return _filter_json(found)

    async def delete_filter(self, actor: str, owner: str, filter_id: str) -> None:
        """Remove the filter: what it hid shows again at once (404 when there is none)."""
        require_self(actor, owner)
        if not _FILTER_ID.match(filter_id):
            raise InvalidInputError(
                "filter ids are 26 lowercase hex digits", code="invalid_filter_id"
            )
        await self._writes.check(actor)
        if not await self._relations.delete_filter(owner, filter_id):
            raise NotFoundError(f"filter {filter_id!r} not found", code="filter_not_found")

    async def filters(
        self, actor: str, user_id: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        """The user's own filters, by filter id, expired ones included until swept."""
        require_self(actor, user_id)
        return await self._pager.listing(
            f"filters:{user_id}",
            partial(self._relations.filters_page, user_id),
            _filter_json,
            limit,
            continuation,
        )

    async def blocks(
        self, actor: str, user_id: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        """The user's own blocks (private: only the user reads them)."""
        require_self(actor, user_id)
        return await self._pager.listing(
            f"blocks:{user_id}",
            partial(self._relations.blocks_page, user_id),
            _block_json,
            limit,
            continuation,
        )

    async def mutes(
        self, actor: str, user_id: str, limit: int | None, continuation: str | None
    ) -> PageOut:
        """The user's own mutes, expired ones included until swept (``expires_at`` says)."""
        require_self(actor, user_id)
        return await self._pager.listing(
            f"mutes:{user_id}",
            partial(self._relations.mutes_page, user_id),
            _mute_json,
            limit,
            continuation,
        )

    def _changing(
        self, kind: RelationKind, actor: str, other: str
    ) -> AbstractAsyncContextManager[None]:
        """Write a block's or mute's two rows, then release the pass that makes them agree
        if the request dies between them (``timeline.delivery.relations``)."""
        return self._outbox.written(RelationChanged(kind=kind, actor=actor, other=other))

    async def _check(self, actor: str, user_id: str, other: str, verb: str) -> None:
        require_self(actor, user_id)
        validate_user_id(other)
        if other == user_id:
            raise InvalidInputError(f"users cannot {verb} themselves", code=f"self_{verb}")
        await self._writes.check(actor)

    async def _refuse_past_cap(self, user_id: str, prefix: str, most: int, what: str) -> None:
        if await self._relations.count(user_id, prefix, most) >= most:
            raise ConflictError(
                f"a user holds at most {most} {what}: remove one first", code=f"too_many_{what}"
            )


async def refuse_if_blocked(
    relations: RelationsRepository, actor: str, other: str, verb: str
) -> None:
    """A repost of, or reply to, a user who blocks the actor or whom it blocks is refused
    (403 ``blocked``, as a follow): two point reads."""
    if actor != other and await relations.blocked_either(actor, other):
        raise PermissionDeniedError(
            f"{actor} cannot {verb} {other}'s posts: one blocks the other", code="blocked"
        )


def _until(expires_at: datetime | None) -> float | None:
    """An expiry as epoch seconds: in the future, within 100 years (None: no end)."""
    if expires_at is None:
        return None
    if expires_at.tzinfo is None:
        raise InvalidInputError(
            "expires_at must name its time zone (RFC 3339)", code="invalid_expiry"
        )
    try:
        until = expires_at.timestamp()
    except (OverflowError, ValueError):  # e.g. year 1 at +14:00: before year 1 in UTC
        until = 0.0
    if not time.time() < until <= time.time() + MAX_EXPIRY_S:
        raise InvalidInputError(
            "expires_at must be in the future, within 100 years", code="invalid_expiry"
        )
    return until


def _expiry_json(expires_at: float | None) -> str | None:
    return None if expires_at is None else format_time(datetime.fromtimestamp(expires_at, UTC))


def _filter_json(found: Filter) -> dict[str, Any]:
    return {
        "filter_id": found.filter_id,
        "phrase": found.phrase,
        "since": format_time(found.since),
        "expires_at": _expiry_json(found.expires_at),
    }


def _block_json(item: tuple[str, datetime]) -> dict[str, Any]:
    return {"user_id": item[0], "since": format_time(item[1])}


def _mute_json(mute: Mute) -> dict[str, Any]:
    return {
        "user_id": mute.user_id,
        "since": format_time(mute.since),
        "expires_at": _expiry_json(mute.expires_at),
        "reposts": mute.reposts,
    }
