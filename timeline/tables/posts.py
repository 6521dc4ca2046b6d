"""The ``posts`` table: the source of truth for posts, one partition per author, with the
author's post count and the rows that remember each idempotency key's post for its window
(``timeline.model.idempotency``)."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from azure.data.tables import TableEntity, TableTransactionError

from timeline.errors import ConflictError, StorageUnavailableError, contention
from timeline.model.entities import DETACHED, POST_SELECT, Page, Post
from timeline.model.idempotency import IdempotencyRecord
from timeline.model.keys import post_row_key
from timeline.retry import ETAG_ATTEMPTS
from timeline.storage.accounts import Storage
from timeline.storage.calls import (
    TransactionOperation,
    failed_index,
    query_page,
)
from timeline.storage.names import POSTS
from timeline.tables.counters import transact_counted
from timeline.tables.expiries import IDEMPOTENCY, ExpiriesRepository
from timeline.tables.rows import (
    META,
    PARTITION,
    delete_entity,
    etag,
    get_entity,
    if_unchanged,
    merge_existing,
    partition_page,
)
from timeline.tables.traces import sweep_traces, trace_of

KEY_ROWS = f"{META}idem-"
"""An idempotency key's row: ``~idem-{HMAC of the key}``, its post and its record."""


class PostsRepository:
    """The source of truth for posts: ``posts``, one partition per author; a post row is
    written once, by the API."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._expiries = ExpiriesRepository(storage)

    async def add(self, post: Post, record: IdempotencyRecord | None = None) -> Post:
        """Store the post and count it, atomically, with its idempotency key's row; a
        concurrent first use of the key gets that request's post (or a 422 for another
        request)."""
        rows: list[TransactionOperation] = [("create", post.to_entity(post.author))]
        if record is not None:
            key_row = self._key_row(post.author, record, post.post_id)
            rows.append(("create", key_row))
            await self._expiries.note(
                IDEMPOTENCY, POSTS, post.author, key_row["RowKey"], at=record.expires_at
            )  # filed first: it ends once the key's window has
        try:
            await transact_counted(self._storage, POSTS, post.author, rows, +1)
        except TableTransactionError as error:
            if record is not None and failed_index(error, 409) == 1:
                earlier = await self.by_key(post.author, record)
                if earlier is not None:
                    return earlier
                raise StorageUnavailableError(
                    "this Idempotency-Key is being used by another request; try again",
                    retry_after=1,
                ) from None
            if failed_index(error, 409) == 0:
                return post  # a resend of this very transaction, stored (post ids are random)
            raise
        return post

    def _key_row(self, author: str, record: IdempotencyRecord, post_id: str) -> dict[str, Any]:
        row_key = f"{KEY_ROWS}{record.key}"
        return {"PartitionKey": author, "RowKey": row_key, "post": post_id, **record.fields()}

    async def by_key(self, author: str, record: IdempotencyRecord) -> Post | None:
        """The post the first request with this record's key created, while the key is live.

        None when the key is unused or its record has expired (the expired row is removed
        then, so the key is free again); 422 when it is live for a different request; 409
        when its post has since been deleted."""
        row_key = f"{KEY_ROWS}{record.key}"
        entity = await get_entity(self._storage, POSTS, author, row_key)
        if entity is None:
            return None
        if not record.replays(entity):
            await self._remove(author, entity)
            return None
        post = await self.get(author, str(entity["post"]))
        if post is None:
            raise ConflictError(
                "this Idempotency-Key was used for a post that has since been deleted",
                code="idempotency_key_reused",
            )
        return post

    async def _remove(self, author: str, entity: TableEntity) -> None:
        """Delete an expired key row unless it changed since read (a new use of the key)."""
        await delete_entity(self._storage, POSTS, author, entity["RowKey"], etag(entity))

    async def get(self, author: str, post_id: str) -> Post | None:
        entity = await self._row(author, post_id)
        return None if entity is None else Post.from_entity(entity)

    async def _row(self, author: str, post_id: str) -> TableEntity | None:
        return await get_entity(
            self._storage, POSTS, author, post_row_key(post_id), select=POST_SELECT
        )

    async def detach_reply(self, author: str, post_id: str) -> bool:
        """Mark the reply as answering a deleted account (``DETACHED``); False when the post
        is not there (never stored, or deleted)."""
        row = {"PartitionKey": author, "RowKey": post_row_key(post_id), "reply_author": DETACHED}
        return await merge_existing(self._storage, POSTS, row)

    async def delete(self, author: str, post_id: str) -> bool:
        """Delete the post and uncount it, atomically, leaving its removal trace (for merged
        readers' streams); then sweep the author's expired traces. False when it was not
        there."""
        for _ in range(ETAG_ATTEMPTS):
            entity = await self._row(author, post_id)
            if entity is None:
                return False
            keys = {"PartitionKey": author, "RowKey": post_row_key(post_id)}
            row: TransactionOperation = ("delete", keys, if_unchanged(entity))
            try:
                await transact_counted(self._storage, POSTS, author, [row, trace_of(keys)], -1)
                with suppress(StorageUnavailableError):  # housekeeping: the next delete sweeps
                    await sweep_traces(self._storage, POSTS, author)
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
            select=POST_SELECT,
            limit=limit,
            continuation=continuation,
            until=until,
        )
        posts = [Post.from_entity(entity) for entity in page.items]
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
        """The ids among ``posts`` that still exist (not deleted)."""
        alive = await self.live_row_keys(author, [post.row_key for post in posts])
        return {post.post_id for post in posts if post.row_key in alive}

    async def live_row_keys(self, author: str, row_keys: list[str]) -> dict[str, str]:
        """Which of these post row keys are live posts now, each with the user its reply
        answers ("" for a post that is no reply): one range query per 1,000."""
        if not row_keys:
            return {}
        continuation: dict[str, str] | None = None
        alive: dict[str, str] = {}
        wanted = set(row_keys)
        while True:
            async with self._storage.guard():
                page = await query_page(
                    self._storage.reader(POSTS, author),
                    f"{PARTITION} and RowKey ge @first and RowKey le @last",
                    {"pk": author, "first": min(row_keys), "last": max(row_keys)},
                    select=["RowKey", "reply_author"],
                    limit=1000,
                    continuation=continuation,
                )
            alive.update(
                (row["RowKey"], row.get("reply_author") or "")
                for row in page.items
                if row["RowKey"] in wanted
            )
            continuation = page.continuation
            if continuation is None:
                return alive
