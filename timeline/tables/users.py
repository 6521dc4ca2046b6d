"""The ``users`` table: one profile row per user, in the user's own partition, and one
identity row per case-folded id, naming the one spelling that owns it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from timeline.errors import ConflictError
from timeline.model.entities import PROFILE_ROW_KEY, User
from timeline.model.idempotency import IdempotencyRecord
from timeline.model.keys import fold_user_id
from timeline.storage import calls
from timeline.storage.accounts import Storage
from timeline.storage.calls import query_page, submit_batch
from timeline.storage.names import (
    POSTS,
    RELATIONS,
    SUBJECT_FOLLOWERS,
    SUBJECT_FOLLOWING,
    TIMELINES,
    USERS,
)
from timeline.tables.counters import count_of
from timeline.tables.credentials import DELETED_AT, IDENTITY_ROW_KEY, TOKEN_EPOCH
from timeline.tables.relations import BLOCK_AND_MUTE_RANGES, BLOCKS_OR_MUTES, muted_by
from timeline.tables.rows import (
    LISTING,
    META,
    PARTITION,
    create_entity,
    delete_entity,
    drop_partition,
    get_entity,
)

DELETIONS = f"{META}deletions"
"""The ``users`` partition of the accounts whose deletion is in progress (a row each)."""
_OWN_ROWS = {"rp": f"{META}rp", "rq": f"{META}rq", "re": f"{META}re-", "rf": f"{META}re."}
"""The ranges of a ``posts`` partition's repost and repost index rows (``~rp-``,
``~rpof-``), and of its reply index rows (``~re-``)."""
_POSTS_REPOSTS_OR_REPLIES = (
    "PartitionKey eq @pk and ( RowKey lt @meta or ( RowKey ge @rp and RowKey lt @rq ) or "
    "( RowKey ge @re and RowKey lt @rf ) )"
)

# The identity row (``IDENTITY_ROW_KEY``), in the partition of an id's case fold (``carol``
# for ``Carol``), has the spelling that owns every id of that fold as ``user_id``. A deleted
# account's stays, with ``deleted_at``: its tombstone, which keeps the id (every spelling
# of it) taken and refuses its tokens.


class UsersRepository:
    """Profiles in ``users``; their counters are read from the partitions that own them."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def create(self, user: User, idempotency: IdempotencyRecord | None = None) -> bool:
        """Create the profile; False when this is a replay of the request that created it
        (``IdempotencyRecord.replays``) and its tokens were never revoked since."""
        await self.claim_identity(user.user_id)
        entity = user.to_entity()
        if idempotency is not None:
            entity.update(idempotency.fields())
        if await create_entity(self._storage, USERS, entity):
            if await self.deleted(user.user_id):  # a deletion took the id meanwhile
                await self.delete_profile(user.user_id)
                raise ConflictError(f"user id {user.user_id!r} is taken", code="user_exists")
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

    async def locked(self, user_id: str) -> bool | None:
        """Whether the user is locked; None when there is no such user (one point read)."""
        entity = await get_entity(
            self._storage, USERS, user_id, PROFILE_ROW_KEY, select=["RowKey", "locked"]
        )
        return None if entity is None else bool(entity.get("locked", False))

    async def update(self, user_id: str, changes: dict[str, Any]) -> bool:
        """Merge ``changes`` into the profile row; False when there is none."""
        row = {"PartitionKey": user_id, "RowKey": PROFILE_ROW_KEY, **changes}
        async with self._storage.guard(kind="write-1"):
            try:
                await calls.update_entity(
                    self._storage.table(USERS, user_id), row, UpdateMode.MERGE
                )
            except ResourceNotFoundError:
                return False
        return True

    async def tombstone(self, user_id: str) -> None:
        """File the deletion as in progress, then mark the id's identity row deleted
        (idempotent): from now on the id cannot be registered again and its tokens are
        refused (``CredentialsRepository.state``)."""
        entry = {"PartitionKey": DELETIONS, "RowKey": user_id, DELETED_AT: time.time()}
        await submit_batch(self._storage, USERS, DELETIONS, [("upsert", entry)])
        row: dict[str, Any] = {"PartitionKey": fold_user_id(user_id), "RowKey": IDENTITY_ROW_KEY}
        row |= {"user_id": user_id, DELETED_AT: time.time()}
        async with self._storage.guard(kind="write-1"):
            await calls.update_entity(self._storage.table(USERS, row["PartitionKey"]), row)

    async def deletions(self, most: int = 1000) -> list[str]:
        """The accounts whose deletion is in progress (at most ``most``): one query."""
        async with self._storage.guard(kind="query"):
            page = await query_page(
                self._storage.reader(USERS, DELETIONS),
                PARTITION,
                {"pk": DELETIONS},
                select=["RowKey"],
                limit=most,
                continuation=None,
            )
        return [str(row["RowKey"]) for row in page.items]

    async def undone(self, user_id: str) -> bool:
        """Whether nothing of the account is left to undo: no post, repost, repost index or
        reply index row of it, no follower or list membership, no follow, no block or mute
        either way (five one-row queries)."""
        checks: tuple[tuple[str, str, str, dict[str, str]], ...] = (
            (POSTS, user_id, _POSTS_REPOSTS_OR_REPLIES, _OWN_ROWS),
            (SUBJECT_FOLLOWERS, user_id, LISTING, {}),
            (SUBJECT_FOLLOWING, user_id, LISTING, {}),
            (RELATIONS, user_id, BLOCKS_OR_MUTES, BLOCK_AND_MUTE_RANGES),
            (RELATIONS, muted_by(user_id), PARTITION, {}),
        )
        found = await asyncio.gather(
            *(self._any(table, pk, query, extra) for table, pk, query, extra in checks)
        )
        return not any(found)

    async def _any(self, table: str, partition: str, query: str, extra: dict[str, str]) -> bool:
        async with self._storage.guard(kind="query-1"):
            page = await query_page(
                self._storage.reader(table, partition),
                query,
                {"pk": partition, "meta": META, **extra},
                select=["RowKey"],
                limit=1,
                continuation=None,
            )
        return bool(page.items) or page.continuation is not None

    async def drop_account(self, user_id: str) -> None:
        """Drop every partition of the account but its tombstone, and its entry among the
        deletions in progress (last)."""
        for table in (TIMELINES, POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, RELATIONS):
            await drop_partition(self._storage, table, user_id)
        await drop_partition(self._storage, RELATIONS, muted_by(user_id))
        await drop_partition(self._storage, USERS, user_id, keep=IDENTITY_ROW_KEY)
        await delete_entity(self._storage, USERS, DELETIONS, user_id)

    async def tidy_after(self, user_id: str) -> None:
        """After the account's deletion has ended, drop what a late follow or unfollow of it
        left in its follow partitions (counter rows); nothing while it is in progress (its
        own last step drops them)."""
        if await get_entity(self._storage, USERS, DELETIONS, user_id) is None:
            for table in (SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING):
                await drop_partition(self._storage, table, user_id)

    async def forget_deletion(self, user_id: str) -> None:
        """Remove an entry among the deletions in progress that has no tombstone (its
        request died before it)."""
        await delete_entity(self._storage, USERS, DELETIONS, user_id)

    async def deleted(self, user_id: str) -> bool:
        """Whether the account was deleted (its tombstone is there): one point read."""
        folded = fold_user_id(user_id)
        row = await get_entity(self._storage, USERS, folded, IDENTITY_ROW_KEY)
        return row is not None and row.get(DELETED_AT) is not None

    async def delete_profile(self, user_id: str) -> None:
        """Remove the profile row (idempotent): the user is a 404 from now on."""
        await delete_entity(self._storage, USERS, user_id, PROFILE_ROW_KEY)

    async def claim_identity(self, user_id: str) -> None:
        """Make ``user_id`` the spelling that owns its case fold, before its profile exists;
        409 when another spelling owns it. The claim is never taken back: a registration that
        dies between its claim and its profile leaves the fold reserved for that spelling,
        which a retry (or anyone) registering the same spelling completes. So two spellings
        of one fold never both get a profile, whatever interleaving or crash."""
        folded = fold_user_id(user_id)
        claim = {"PartitionKey": folded, "RowKey": IDENTITY_ROW_KEY, "user_id": user_id}
        if await create_entity(self._storage, USERS, claim):
            return
        existing = await get_entity(self._storage, USERS, folded, IDENTITY_ROW_KEY)
        if existing is None:  # claims are never deleted; only a storage rollback gets here
            raise ConflictError(f"user id {user_id!r} is being claimed", code="user_exists")
        owner = str(existing["user_id"])
        if existing.get(DELETED_AT) is not None:
            raise ConflictError(f"user id {user_id!r} is taken", code="user_exists")
        if owner != user_id:
            raise ConflictError(
                f"user id {user_id!r} is taken: ids are unique ignoring case and {owner!r} exists",
                code="user_exists",
            )
