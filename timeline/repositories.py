"""Async repositories: the only code that knows table layouts and OData filters."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.entities import POST_SELECT, PROFILE_ROW_KEY, Edge, Page, Post, User
from timeline.errors import ConflictError, StorageUnavailableError
from timeline.keys import post_row_key
from timeline.storage import (
    POSTS,
    SUBJECT_FOLLOWERS,
    SUBJECT_FOLLOWING,
    TIMELINES,
    USERS,
    Operation,
    Storage,
    chunked,
    query_page,
    submit_batch,
)

log = logging.getLogger(__name__)

PARTITION = "PartitionKey eq @pk"
_COUNTER_ATTEMPTS = 20


class UsersRepository:
    """Profiles and their follower/following/post counters in ``users``."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def create(self, user: User) -> None:
        client = self._storage.table(USERS, user.user_id)
        async with self._storage.guard():
            try:
                await client.create_entity(user.to_entity())
            except ResourceExistsError:
                raise ConflictError(
                    f"user {user.user_id!r} already exists", code="user_exists"
                ) from None

    async def get(self, user_id: str) -> User | None:
        entity = await _get_entity(self._storage, USERS, user_id, PROFILE_ROW_KEY)
        return None if entity is None else User.from_entity(entity)

    async def exists(self, user_id: str) -> bool:
        entity = await _get_entity(
            self._storage, USERS, user_id, PROFILE_ROW_KEY, select=["RowKey"]
        )
        return entity is not None

    async def adjust_counters(self, user_id: str, **deltas: int) -> None:
        """Add ``deltas`` to named counters with optimistic concurrency (ETag, retried)."""
        client = self._storage.table(USERS, user_id)
        for _ in range(_COUNTER_ATTEMPTS):
            entity = await _get_entity(self._storage, USERS, user_id, PROFILE_ROW_KEY)
            if entity is None:
                return
            patch: dict[str, Any] = {"PartitionKey": user_id, "RowKey": PROFILE_ROW_KEY}
            for name, delta in deltas.items():
                patch[name] = max(0, int(entity.get(name, 0)) + delta)
            async with self._storage.guard():
                try:
                    await client.update_entity(
                        patch,
                        mode=UpdateMode.MERGE,
                        etag=entity.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified,
                    )
                except ResourceModifiedError:
                    continue
            return
        raise StorageUnavailableError("too much contention on a profile", retry_after=1)


class PostsRepository:
    """The source of truth for posts: ``posts``, one partition per author."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def add(self, post: Post) -> None:
        client = self._storage.table(POSTS, post.author)
        async with self._storage.guard():
            await client.create_entity(post.to_entity(post.author))

    async def get(self, author: str, post_id: str) -> Post | None:
        entity = await _get_entity(
            self._storage, POSTS, author, post_row_key(post_id), select=POST_SELECT
        )
        return None if entity is None else Post.from_entity(entity)

    async def delete(self, author: str, post_id: str) -> bool:
        """Delete the post; False when it was already gone."""
        return await _delete_existing(self._storage, POSTS, author, post_row_key(post_id))

    async def page(
        self, author: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Post]:
        return await _post_page(self._storage, POSTS, author, limit, continuation)

    async def surviving(self, author: str, posts: list[Post]) -> set[str]:
        """The ids among ``posts`` (newest first, as stored) that still exist."""
        if not posts:
            return set()
        keys = await _row_keys_between(
            self._storage, POSTS, author, posts[0].row_key, posts[-1].row_key
        )
        return {post.post_id for post in posts if post.row_key in keys}


class TimelinesRepository:
    """Delivered copies of posts in ``timelines``, one partition per timeline owner."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def put_many(self, owner: str, posts: Iterable[Post]) -> None:
        """Upsert into one partition, 100 operations per Entity Group Transaction."""
        operations: list[Operation] = [("upsert", post.to_entity(owner)) for post in posts]
        await _submit_batches(self._storage, TIMELINES, owner, operations)

    async def row_keys_by_author(self, owner: str, author: str) -> list[str]:
        """Every row key in ``owner``'s timeline delivered from ``author``."""
        scan = _scan(self._storage, TIMELINES, owner, "author eq @author", {"author": author})
        return [key async for key in scan]

    async def page(self, owner: str, limit: int, continuation: dict[str, str] | None) -> Page[Post]:
        return await _post_page(self._storage, TIMELINES, owner, limit, continuation)


class FollowsRepository:
    """Both sides of every follow: ``subjectFollowers`` and its reverse ``subjectFollowing``."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def add(self, follower: str, subject: str, since: datetime) -> bool:
        """Record the follow; True if it is new. ``subjectFollowing`` decides, atomically."""
        following = self._storage.table(SUBJECT_FOLLOWING, follower)
        followers = self._storage.table(SUBJECT_FOLLOWERS, subject)
        created = True
        async with self._storage.guard():
            try:
                await following.create_entity(
                    {"PartitionKey": follower, "RowKey": subject, "since": since}
                )
            except ResourceExistsError:
                created = False
        if not created:  # keep the first ``since``; the reverse row may be missing after a crash
            existing = await _get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)
            since = existing["since"] if existing is not None else since
        async with self._storage.guard():
            await followers.upsert_entity(
                {"PartitionKey": subject, "RowKey": follower, "since": since},
                mode=UpdateMode.REPLACE,
            )
        return created

    async def remove(self, follower: str, subject: str) -> bool:
        """Remove the follow; True if it existed."""
        existed = await _delete_existing(self._storage, SUBJECT_FOLLOWING, follower, subject)
        client = self._storage.table(SUBJECT_FOLLOWERS, subject)
        async with self._storage.guard():
            await client.delete_entity(subject, follower)
        return existed

    async def is_following(self, follower: str, subject: str) -> bool:
        entity = await _get_entity(
            self._storage, SUBJECT_FOLLOWING, follower, subject, select=["RowKey"]
        )
        return entity is not None

    async def followers_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        return await _edge_page(self._storage, SUBJECT_FOLLOWERS, subject, limit, continuation)

    async def following_page(
        self, follower: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        return await _edge_page(self._storage, SUBJECT_FOLLOWING, follower, limit, continuation)

    async def follower_ids_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[str]:
        """Only the ids: what a fan-out needs, without parsing a timestamp per follower."""
        page = await _partition_page(
            self._storage,
            SUBJECT_FOLLOWERS,
            subject,
            select=["RowKey"],
            limit=limit,
            continuation=continuation,
        )
        return Page([entity["RowKey"] for entity in page.items], page.continuation)

    async def followers_between(self, subject: str, first: str, last: str) -> set[str]:
        """Followers of ``subject`` whose ids lie in ``[first, last]``."""
        return await _row_keys_between(self._storage, SUBJECT_FOLLOWERS, subject, first, last)


async def _row_keys_between(
    storage: Storage, table: str, partition_key: str, first: str, last: str
) -> set[str]:
    """Row keys in ``[first, last]`` of one partition."""
    condition = "RowKey ge @first and RowKey le @last"
    scan = _scan(storage, table, partition_key, condition, {"first": first, "last": last})
    return {key async for key in scan}


async def _get_entity(
    storage: Storage,
    table: str,
    partition_key: str,
    row_key: str,
    *,
    select: list[str] | None = None,
) -> TableEntity | None:
    """One point read by both keys (the cheapest call there is); None when missing."""
    client = storage.table(table, partition_key)
    async with storage.guard():
        try:
            return await client.get_entity(partition_key, row_key, select=select)
        except ResourceNotFoundError:
            return None


async def _delete_existing(storage: Storage, table: str, partition_key: str, row_key: str) -> bool:
    """Delete one entity and say whether it was there (a one-operation transaction fails on 404,
    where ``delete_entity`` would silently succeed)."""
    client = storage.table(table, partition_key)
    async with storage.guard():
        try:
            await client.submit_transaction(
                [("delete", {"PartitionKey": partition_key, "RowKey": row_key})]
            )
        except TableTransactionError as error:
            if error.status_code == 404:
                return False
            raise
    return True


async def _submit_batches(
    storage: Storage, table: str, partition_key: str, operations: list[Operation]
) -> None:
    for batch in chunked(operations):
        await submit_batch(storage, table, partition_key, batch)


async def _partition_page(
    storage: Storage,
    table: str,
    partition_key: str,
    *,
    select: list[str],
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[TableEntity]:
    """One page of one partition in row-key order: exactly one storage query."""
    client = storage.table(table, partition_key)
    async with storage.guard():
        return await query_page(
            client,
            PARTITION,
            {"pk": partition_key},
            select=select,
            limit=limit,
            continuation=continuation,
        )


async def _scan(
    storage: Storage,
    table: str,
    partition_key: str,
    condition: str,
    parameters: dict[str, Any],
) -> AsyncIterator[str]:
    """Row keys of one partition matching ``condition``, 1,000 per storage query."""
    client = storage.table(table, partition_key)
    continuation: dict[str, str] | None = None
    while True:
        async with storage.guard():
            page = await query_page(
                client,
                f"{PARTITION} and {condition}",
                {"pk": partition_key, **parameters},
                select=["RowKey"],
                limit=1000,
                continuation=continuation,
            )
        for entity in page.items:
            yield entity["RowKey"]
        continuation = page.continuation
        if continuation is None:
            return


async def _post_page(
    storage: Storage,
    table: str,
    partition_key: str,
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[Post]:
    page = await _partition_page(
        storage, table, partition_key, select=POST_SELECT, limit=limit, continuation=continuation
    )
    return Page([Post.from_entity(entity) for entity in page.items], page.continuation)


async def _edge_page(
    storage: Storage,
    table: str,
    partition_key: str,
    limit: int,
    continuation: dict[str, str] | None,
) -> Page[Edge]:
    page = await _partition_page(
        storage,
        table,
        partition_key,
        select=["RowKey", "since"],
        limit=limit,
        continuation=continuation,
    )
    edges = [Edge(entity["RowKey"], entity["since"]) for entity in page.items]
    return Page(edges, page.continuation)


@dataclass(frozen=True, slots=True)
class Repositories:
    """Every repository over one ``Storage``."""

    users: UsersRepository
    posts: PostsRepository
    timelines: TimelinesRepository
    follows: FollowsRepository

    @classmethod
    def on(cls, storage: Storage) -> Repositories:
        return cls(
            UsersRepository(storage),
            PostsRepository(storage),
            TimelinesRepository(storage),
            FollowsRepository(storage),
        )
