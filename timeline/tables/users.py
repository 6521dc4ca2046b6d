"""The ``users`` table: one profile row per user, in the user's own partition."""

from __future__ import annotations

import asyncio

from timeline.errors import ConflictError
from timeline.model.entities import PROFILE_ROW_KEY, User
from timeline.model.idempotency import IdempotencyRecord
from timeline.storage.accounts import Storage
from timeline.storage.counters import count_of
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, USERS
from timeline.tables.credentials import TOKEN_EPOCH
from timeline.tables.rows import create_entity, get_entity


class UsersRepository:
    """Profiles in ``users``; their counters are read from the partitions that own them."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def create(self, user: User, idempotency: IdempotencyRecord | None = None) -> bool:
        """Create the profile; False when this is a replay of the request that created it
        (``IdempotencyRecord.replays``) and its tokens were never revoked since."""
        entity = user.to_entity()
        if idempotency is not None:
            entity.update(idempotency.fields())
        if await create_entity(self._storage, USERS, entity):
            return True
        existing = await get_entity(self._storage, USERS, user.user_id, PROFILE_ROW_KEY)
        replay = existing is not None and idempotency is not None and idempotency.replays(existing)
        if replay and existing is not None and not existing.get(TOKEN_EPOCH):
            return False
        raise ConflictError(f"user {user.user_id!r} already exists", code="user_exists")

    async def get(self, user_id: str) -> User | None:
        profile, posts, followers, following = await asyncio.gather(
            get_entity(self._storage, USERS, user_id, PROFILE_ROW_KEY),
            count_of(self._storage, POSTS, user_id),
            count_of(self._storage, SUBJECT_FOLLOWERS, user_id),
            count_of(self._storage, SUBJECT_FOLLOWING, user_id),
        )
        if profile is None:
            return None
        return User.from_entity(profile).with_counts(
            followers=followers, following=following, posts=posts
        )

    async def exists(self, user_id: str) -> bool:
        entity = await get_entity(self._storage, USERS, user_id, PROFILE_ROW_KEY, select=["RowKey"])
        return entity is not None
