"""The ``posts`` table: the source of truth for posts, one partition per author, with the
author's post count and the rows that remember each idempotency key's post."""

from __future__ import annotations

import hashlib
from typing import Any

from azure.data.tables import TableEntity, TableTransactionError

from timeline.errors import ConflictError, StorageUnavailableError
from timeline.model.entities import POST_SELECT, Page, Post
from timeline.model.keys import post_row_key
from timeline.storage.accounts import Storage
from timeline.storage.calls import TransactionOperation, failed_index, query_page
from timeline.storage.counters import transact_counted
from timeline.storage.names import POSTS
from timeline.tables.rows import (
    ATTEMPTS,
    META,
    PARTITION,
    contention,
    create_entity,
    get_entity,
    if_unchanged,
    partition_page,
)


def key_digest(idempotency_key: str) -> str:
    """What is stored of a client's idempotency key: its SHA-256, never the key itself."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


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
        entity = await get_entity(self._storage, POSTS, author, row_key)
        return None if entity is None else await self.get(author, str(entity["post"]))

    async def get(self, author: str, post_id: str) -> Post | None:
        entity = await self._row(author, post_id)
        return None if entity is None or entity.get("void") else Post.from_entity(entity)

    async def _row(self, author: str, post_id: str) -> TableEntity | None:
        return await get_entity(
            self._storage, POSTS, author, post_row_key(post_id), select=[*POST_SELECT, "void"]
        )

    async def void(self, author: str, post_id: str) -> bool:
        """Claim a post id the API never stored in time, so a late write of it fails and the
        post can never appear unfanned; False when a real post was stored first."""
        entity = {"PartitionKey": author, "RowKey": post_row_key(post_id), "void": True}
        if await create_entity(self._storage, POSTS, entity):
            return True
        row = await self._row(author, post_id)
        return row is None or bool(row.get("void"))

    async def delete(self, author: str, post_id: str) -> bool:
        """Delete the post and uncount it, atomically; False when it was not there."""
        for _ in range(ATTEMPTS):
            entity = await self._row(author, post_id)
            if entity is None or entity.get("void"):
                return False
            keys = {"PartitionKey": author, "RowKey": post_row_key(post_id)}
            row: TransactionOperation = ("delete", keys, if_unchanged(entity))
            try:
                await transact_counted(self._storage, POSTS, author, [row], -1)
                return True
            except TableTransactionError as error:
                if failed_index(error, 404, 412) != 0:
                    raise
        raise contention()

    async def page(
        self, author: str, limit: int, continuation: dict[str, str] | None, until: str = META
    ) -> Page[Post]:
        """One query's worth of the author's posts, newest first, stopping before the row key
        ``until`` (a newer-than read)."""
        page = await partition_page(
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
