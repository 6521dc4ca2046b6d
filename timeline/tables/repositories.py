"""Async repositories: the only code that knows table layouts and OData filters.

Each fact has one home, and every change of a fact and of the counter that counts it is one
Entity Group Transaction in that home's partition, so counters are exact after any crash:

- a post lives in ``posts`` (its author's partition) with the author's count;
- a follow lives in ``subjectFollowers`` (the subject's partition, the one fan-out reads)
  with the subject's follower count: this row is the truth about who follows whom;
- ``subjectFollowing`` is an index derived from it (the follower's partition, with the
  follower's count), kept in step by ``FollowsRepository.sync_index``.

A count is spread over several counter rows summed on read (``timeline.storage.counters``), so the
writers of one hot partition do not queue on one row's ETag.

Rows whose key starts with ``~`` are metadata; user ids and post row keys never do, and every
listing query stops below ``~``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableEntity, TableTransactionError, UpdateMode

from timeline.errors import ConflictError, StorageUnavailableError
from timeline.metrics import TRIM_REQUESTS
from timeline.model.entities import POST_SELECT, PROFILE_ROW_KEY, Edge, Page, Post, User
from timeline.model.keys import post_row_key
from timeline.storage.accounts import Storage
from timeline.storage.calls import (
    Operation,
    TransactionOperation,
    chunked,
    failed_index,
    query_page,
    size_kind,
    submit_batch,
    transact,
)
from timeline.storage.counters import count_of, transact_counted
from timeline.storage.names import POSTS, SUBJECT_FOLLOWERS, SUBJECT_FOLLOWING, TIMELINES, USERS
from timeline.tables.audience import FIRST_POST_KEY, AudienceRepository

log = logging.getLogger(__name__)

META = "~"
"""Row keys from here on are metadata: counters and idempotency keys."""
PARTITION = "PartitionKey eq @pk"
LISTING = "PartitionKey eq @pk and RowKey lt @meta"
POST_LISTING = "PartitionKey eq @pk and RowKey ge @first and RowKey lt @meta"
"""A timeline's posts: its head rows (merge rows, ``timeline.tables.audience``) sort before them."""
_ATTEMPTS = 20
"""Rounds on a fact row changed under us (one follower pair or one post: rare, never hot)
before it is reported as a retryable 503; counter contention is ``timeline.storage.counters``'."""
_KEYS_PER_FILTER = 14
"""Azure Table Storage allows at most 15 comparisons in one filter (one is the partition)."""


def key_digest(idempotency_key: str) -> str:
    """What is stored of a client's idempotency key: its SHA-256, never the key itself."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


class UsersRepository:
    """Profiles in ``users``; their counters are read from the partitions that own them."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def create(self, user: User, idempotency_key: str | None = None) -> bool:
        """Create the profile; False when the same idempotency key created it before."""
        entity = user.to_entity()
        if idempotency_key is not None:
            entity["idempotency"] = key_digest(idempotency_key)
        if await _create(self._storage, USERS, entity):
            return True
        existing = await _get_entity(self._storage, USERS, user.user_id, PROFILE_ROW_KEY)
        digest = None if idempotency_key is None else key_digest(idempotency_key)
        if existing is not None and digest is not None and existing.get("idempotency") == digest:
            return False
        raise ConflictError(f"user {user.user_id!r} already exists", code="user_exists")

    async def get(self, user_id: str) -> User | None:
        profile, posts, followers, following = await asyncio.gather(
            _get_entity(self._storage, USERS, user_id, PROFILE_ROW_KEY),
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
        entity = await _get_entity(
            self._storage, USERS, user_id, PROFILE_ROW_KEY, select=["RowKey"]
        )
        return entity is not None


class PostsRepository:
    """The source of truth for posts: ``posts``, one partition per author.

    A post row is written once by the API, or claimed as ``void`` by the worker when the API
    never wrote it in time (so a late write cannot publish a post nobody fans out)."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def add(self, post: Post, idempotency_key: str | None = None) -> Post:
        """Store the post and count it, atomically; with a key already used, the earlier post."""
        rows: list[TransactionOperation] = [("create", post.to_entity(post.author))]
        if idempotency_key is not None:
            rows.append(("create", self._key_row(post.author, idempotency_key, post.post_id)))
        try:
            await transact_counted(self._storage, POSTS, post.author, rows, +1)
        except TableTransactionError as error:
            if idempotency_key is not None and failed_index(error, 409) == 1:
                earlier = await self.by_key(post.author, idempotency_key)
                if earlier is not None:
                    return earlier
                raise ConflictError(
                    "this Idempotency-Key was used for a post that has since been deleted",
                    code="idempotency_key_reused",
                ) from None
            if failed_index(error, 409) == 0:
                raise StorageUnavailableError(
                    "the post was not stored in time; try again", retry_after=1
                ) from None
            raise
        return post

    def _key_row(self, author: str, key: str, post_id: str) -> dict[str, Any]:
        return {"PartitionKey": author, "RowKey": f"{META}key-{key_digest(key)}", "post": post_id}

    async def by_key(self, author: str, idempotency_key: str) -> Post | None:
        """The post an earlier request with this idempotency key created, if it still exists."""
        row_key = f"{META}key-{key_digest(idempotency_key)}"
        entity = await _get_entity(self._storage, POSTS, author, row_key)
        return None if entity is None else await self.get(author, str(entity["post"]))

    async def get(self, author: str, post_id: str) -> Post | None:
        entity = await self._row(author, post_id)
        return None if entity is None or entity.get("void") else Post.from_entity(entity)

    async def _row(self, author: str, post_id: str) -> TableEntity | None:
        return await _get_entity(
            self._storage, POSTS, author, post_row_key(post_id), select=[*POST_SELECT, "void"]
        )

    async def void(self, author: str, post_id: str) -> bool:
        """Claim a post id the API never stored in time, so a late write of it fails and the
        post can never appear unfanned; False when a real post was stored first."""
        entity = {"PartitionKey": author, "RowKey": post_row_key(post_id), "void": True}
        if await _create(self._storage, POSTS, entity):
            return True
        row = await self._row(author, post_id)
        return row is None or bool(row.get("void"))

    async def delete(self, author: str, post_id: str) -> bool:
        """Delete the post and uncount it, atomically; False when it was not there."""
        for _ in range(_ATTEMPTS):
            entity = await self._row(author, post_id)
            if entity is None or entity.get("void"):
                return False
            keys = {"PartitionKey": author, "RowKey": post_row_key(post_id)}
            row: TransactionOperation = ("delete", keys, _if_unchanged(entity))
            try:
                await transact_counted(self._storage, POSTS, author, [row], -1)
                return True
            except TableTransactionError as error:
                if failed_index(error, 404, 412) != 0:
                    raise
        raise _contention()

    async def page(
        self, author: str, limit: int, continuation: dict[str, str] | None, until: str = META
    ) -> Page[Post]:
        """One query's worth of the author's posts, newest first, stopping before the row key
        ``until`` (a newer-than read)."""
        page = await _partition_page(
            self._storage,
            POSTS,
            author,
            select=[*POST_SELECT, "void"],
            limit=limit,
            continuation=continuation,
            until=until,
        )
        posts = [Post.from_entity(entity) for entity in page.items if not entity.get("void")]
        return Page(posts, page.continuation)

    async def newest(self, author: str, count: int) -> list[Post]:
        """The newest ``count`` posts, following continuations through short pages."""
        posts: list[Post] = []
        continuation: dict[str, str] | None = None
        while len(posts) < count:
            page = await self.page(author, count - len(posts), continuation)
            posts.extend(page.items)
            continuation = page.continuation
            if continuation is None:
                break
        return posts

    async def surviving(self, author: str, posts: list[Post]) -> set[str]:
        """The ids among ``posts`` that still exist (not deleted, not void)."""
        alive = await self.live_row_keys(author, [post.row_key for post in posts])
        return {post.post_id for post in posts if post.row_key in alive}

    async def live_row_keys(self, author: str, row_keys: list[str]) -> set[str]:
        """Which of these post row keys are live posts now: one range query per 1,000."""
        if not row_keys:
            return set()
        continuation: dict[str, str] | None = None
        alive: set[str] = set()
        while True:
            async with self._storage.guard():
                page = await query_page(
                    self._storage.reader(POSTS, author),
                    f"{PARTITION} and RowKey ge @first and RowKey le @last",
                    {"pk": author, "first": min(row_keys), "last": max(row_keys)},
                    select=["RowKey", "void"],
                    limit=1000,
                    continuation=continuation,
                )
            alive.update(entity["RowKey"] for entity in page.items if not entity.get("void"))
            continuation = page.continuation
            if continuation is None:
                return alive & set(row_keys)


class TimelinesRepository:
    """Delivered copies of posts in ``timelines``, one partition per timeline owner."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def put_many(self, owner: str, posts: Iterable[Post]) -> None:
        """Upsert into one partition, 100 operations per Entity Group Transaction."""
        operations: list[Operation] = [("upsert", post.to_entity(owner)) for post in posts]
        for batch in chunked(operations):
            await submit_batch(self._storage, TIMELINES, owner, batch)

    async def rows_by_author(self, owner: str, author: str) -> AsyncIterator[list[tuple[str, str]]]:
        """Pages of ``(row key, etag)`` of every copy in ``owner``'s timeline from ``author``."""
        continuation: dict[str, str] | None = None
        while True:
            async with self._storage.guard():
                page = await query_page(
                    self._storage.reader(TIMELINES, owner),
                    f"{PARTITION} and author eq @author",
                    {"pk": owner, "author": author},
                    select=["RowKey"],
                    limit=1000,
                    continuation=continuation,
                )
            yield [(entity["RowKey"], _etag(entity)) for entity in page.items]
            continuation = page.continuation
            if continuation is None:
                return

    async def etag_of(self, owner: str, row_key: str) -> str | None:
        entity = await _get_entity(self._storage, TIMELINES, owner, row_key, select=["RowKey"])
        return None if entity is None else _etag(entity)

    async def remove_unchanged(self, owner: str, rows: list[tuple[str, str]]) -> int:
        """Delete each row only if it still has the etag it was read with; a row rewritten
        since (a re-follow's backfill) stays. Returns how many were deleted."""
        deleted = 0
        for chunk in chunked(rows):
            batch: list[TransactionOperation] = [
                ("delete", {"PartitionKey": owner, "RowKey": key}, _if_unchanged_etag(etag))
                for key, etag in chunk
            ]
            while batch:
                try:
                    await transact(self._storage, TIMELINES, owner, batch)
                    deleted += len(batch)
                    break
                except TableTransactionError as error:
                    index = failed_index(error, 404, 412)
                    if index is None:
                        raise
                    del batch[index]
        return deleted

    async def page(self, owner: str, limit: int, continuation: dict[str, str] | None) -> Page[Post]:
        page = await _partition_page(
            self._storage,
            TIMELINES,
            owner,
            select=POST_SELECT,
            limit=limit,
            continuation=continuation,
            posts_only=True,
        )
        return Page([Post.from_entity(entity) for entity in page.items], page.continuation)

    async def trim(self, owner: str, keep: int) -> int:
        """Delete the entries older than the newest ``keep`` among the partition's first
        1,000: one key-only query, then EGT deletes, so one trim's work is bounded (a longer
        timeline shrinks by up to ``1000 - keep`` per trim). A newer entry landing meanwhile
        only pushes the doomed ones further back; an older one (a late backfill) may stay
        past ``keep`` until the next trim. Returns how many were deleted."""
        page = await _partition_page(
            self._storage,
            TIMELINES,
            owner,
            select=["RowKey"],
            limit=1000,
            continuation=None,
            posts_only=True,
        )
        TRIM_REQUESTS.inc()
        doomed = [entity["RowKey"] for entity in page.items][keep:]
        deletes: list[Operation] = [
            ("delete", {"PartitionKey": owner, "RowKey": key}) for key in doomed
        ]
        for batch in chunked(deletes):
            TRIM_REQUESTS.inc()
            await submit_batch(self._storage, TIMELINES, owner, batch)
        return len(doomed)


class FollowsRepository:
    """Follows: ``subjectFollowers`` is the truth, ``subjectFollowing`` its derived index."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    async def add(
        self, follower: str, subject: str, since: datetime, request: str | None = None
    ) -> bool:
        """Record the follow and count it, atomically; False if it already existed.

        ``request`` names the API request (see ``claim``): the change is made together with
        its claim row, so it fails if the worker already gave up waiting for it."""
        edge = {"PartitionKey": subject, "RowKey": follower, "since": since}
        try:
            await transact_counted(
                self._storage,
                SUBJECT_FOLLOWERS,
                subject,
                [("create", edge), *_claim_rows(subject, request)],
                +1,
            )
        except TableTransactionError as error:
            if failed_index(error, 409) == 0:
                return False
            _raise_if_abandoned(error)
            raise
        return True

    async def remove(self, follower: str, subject: str, request: str | None = None) -> bool:
        """Remove the follow and uncount it, atomically; False if there was none."""
        for _ in range(_ATTEMPTS):
            edge = await _get_entity(self._storage, SUBJECT_FOLLOWERS, subject, follower)
            if edge is None:
                return False
            keys = {"PartitionKey": subject, "RowKey": follower}
            rows = [("delete", keys, _if_unchanged(edge)), *_claim_rows(subject, request)]
            try:
                await transact_counted(self._storage, SUBJECT_FOLLOWERS, subject, rows, -1)
                return True
            except TableTransactionError as error:
                _raise_if_abandoned(error)
                if failed_index(error, 404, 412) != 0:
                    raise
        raise _contention()

    async def claim(self, subject: str, request: str) -> bool:
        """Claim an API request's follow change as abandoned, so that if its write is still on
        its way it fails; False when the change was already made."""
        [(_, row)] = _claim_rows(subject, request)
        return await _create(self._storage, SUBJECT_FOLLOWERS, row)

    async def sync_index(self, follower: str, subject: str) -> None:
        """Make ``subjectFollowing`` agree with the truth for one pair.

        Read the index row, then the truth, then write the index row on the condition that it
        is unchanged since it was read; it is never deleted (only marked inactive), so a stale
        sync can never recreate a row another sync has since written. Always writing (even
        when nothing changed) is what makes every later sync invalidate an earlier stale one.
        """
        for _ in range(_ATTEMPTS):
            index = await _get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)
            truth = await _get_entity(self._storage, SUBJECT_FOLLOWERS, subject, follower)
            was_active = index is not None and bool(index.get("active"))
            row = _index_row(follower, subject, truth, index)
            write: TransactionOperation = (
                ("create", row)
                if index is None
                else ("update", row, {"mode": UpdateMode.REPLACE, **_if_unchanged(index)})
            )
            delta = int(truth is not None) - int(was_active)
            try:
                await transact_counted(self._storage, SUBJECT_FOLLOWING, follower, [write], delta)
                return
            except TableTransactionError as error:
                if failed_index(error, 409, 412, 404) is None:
                    raise
        raise _contention()

    async def repair_index(self, follower: str, subject: str) -> None:
        """Sync the index only if it disagrees with the truth (a change made elsewhere, or a
        request that died between the two writes)."""
        index = await _get_entity(self._storage, SUBJECT_FOLLOWING, follower, subject)
        truth = await self.is_following(follower, subject)
        if (index is not None and bool(index.get("active"))) != truth:
            await self.sync_index(follower, subject)

    async def following_among(self, follower: str, subjects: Iterable[str]) -> set[str]:
        """Which of ``subjects`` the follower follows, from its ``subjectFollowing`` rows,
        kept in step with the truth by every follow and unfollow request before it answers
        (and by the worker after a request that died between the two writes): one query per
        14 subjects (a filter holds at most 15 comparisons), all at once."""
        wanted = sorted(set(subjects))
        chunks = [wanted[i : i + _KEYS_PER_FILTER] for i in range(0, len(wanted), _KEYS_PER_FILTER)]
        found = await asyncio.gather(*(self._following_rows(follower, chunk) for chunk in chunks))
        return set().union(*found)

    async def _following_rows(self, follower: str, subjects: list[str]) -> set[str]:
        keys = " or ".join(f"RowKey eq @s{i}" for i in range(len(subjects)))
        parameters = {"pk": follower, **{f"s{i}": subject for i, subject in enumerate(subjects)}}
        async with self._storage.guard():
            page = await query_page(
                self._storage.reader(SUBJECT_FOLLOWING, follower),
                f"{PARTITION} and ( {keys} )",  # the SDK reads a parameter up to a space
                parameters,
                select=["RowKey", "active"],
                limit=1000,
                continuation=None,
            )
        return {entity["RowKey"] for entity in page.items if entity.get("active")}

    async def follower_count(self, subject: str) -> int:
        return await count_of(self._storage, SUBJECT_FOLLOWERS, subject)

    async def is_following(self, follower: str, subject: str) -> bool:
        entity = await _get_entity(
            self._storage, SUBJECT_FOLLOWERS, subject, follower, select=["RowKey"]
        )
        return entity is not None

    async def followers_page(
        self, subject: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        return await _edge_page(self._storage, SUBJECT_FOLLOWERS, subject, limit, continuation)

    async def following_page(
        self, follower: str, limit: int, continuation: dict[str, str] | None
    ) -> Page[Edge]:
        page = await _partition_page(
            self._storage,
            SUBJECT_FOLLOWING,
            follower,
            select=["RowKey", "since", "active"],
            limit=limit,
            continuation=continuation,
        )
        edges = [Edge(e["RowKey"], e["since"]) for e in page.items if e.get("active")]
        return Page(edges, page.continuation)

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


def request_id(follower: str, requested_ticks: int) -> str:
    """Names one follow or unfollow request: its follower and when the API sent it."""
    return f"{follower}-{requested_ticks}"


def _claim_rows(subject: str, request: str | None) -> list[TransactionOperation]:
    if request is None:
        return []
    return [("create", {"PartitionKey": subject, "RowKey": f"{META}req-{request}"})]


def _raise_if_abandoned(error: TableTransactionError) -> None:
    """The claim row (second operation) already exists: the worker gave this request up."""
    if failed_index(error, 409) == 1:
        raise StorageUnavailableError(
            "the change was not stored in time; try again", retry_after=1
        ) from None


def _index_row(
    follower: str, subject: str, truth: TableEntity | None, index: TableEntity | None
) -> dict[str, Any]:
    source = truth if truth is not None else index
    since = source.get("since") if source is not None else None
    return {
        "PartitionKey": follower,
        "RowKey": subject,
        "since": since or datetime.now(UTC),
        "active": truth is not None,
    }


def _etag(entity: TableEntity) -> str:
    return str(entity.metadata["etag"])


def _if_unchanged(entity: TableEntity) -> dict[str, Any]:
    return _if_unchanged_etag(_etag(entity))


def _if_unchanged_etag(etag: str) -> dict[str, Any]:
    return {"etag": etag, "match_condition": MatchConditions.IfNotModified}


def _contention() -> StorageUnavailableError:
    return StorageUnavailableError("too much contention on one partition", retry_after=1)


async def _row_keys_between(
    storage: Storage, table: str, partition_key: str, first: str, last: str
) -> set[str]:
    """Row keys in ``[first, last]`` of one partition."""
    condition = "RowKey ge @first and RowKey le @last"
    scan = _scan(storage, table, partition_key, condition, {"first": first, "last": last})
    return {key async for key in scan}


async def _create(storage: Storage, table: str, entity: dict[str, Any]) -> bool:
    """Insert ``entity``; False when a row with its keys exists (nothing is changed)."""
    async with storage.guard(kind="write-1"):
        try:
            await storage.table(table, entity["PartitionKey"]).create_entity(entity)
            return True
        except ResourceExistsError:
            return False


async def _get_entity(
    storage: Storage,
    table: str,
    partition_key: str,
    row_key: str,
    *,
    select: list[str] | None = None,
) -> TableEntity | None:
    """One point read by both keys (the cheapest call there is); None when missing."""
    async with storage.guard(kind="read"):
        client = storage.reader(table, partition_key)
        try:
            return await client.get_entity(partition_key, row_key, select=select)
        except ResourceNotFoundError:
            return None


async def _partition_page(
    storage: Storage,
    table: str,
    partition_key: str,
    *,
    select: list[str],
    limit: int,
    continuation: dict[str, str] | None,
    posts_only: bool = False,
    until: str = META,
) -> Page[TableEntity]:
    """One page of one partition's listing rows (metadata excluded, and those from ``until``
    on): one storage query."""
    filter_text, parameters = LISTING, {"pk": partition_key, "meta": until}
    if posts_only:
        filter_text, parameters = POST_LISTING, {**parameters, "first": FIRST_POST_KEY}
    async with storage.guard(kind=size_kind("query", limit)):
        return await query_page(
            storage.reader(table, partition_key),
            filter_text,
            parameters,
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
    continuation: dict[str, str] | None = None
    while True:
        async with storage.guard(kind="query-1000"):
            page = await query_page(
                storage.reader(table, partition_key),
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
    audience: AudienceRepository

    @classmethod
    def on(cls, storage: Storage) -> Repositories:
        return cls(
            UsersRepository(storage),
            PostsRepository(storage),
            TimelinesRepository(storage),
            FollowsRepository(storage),
            AudienceRepository(storage),
        )
